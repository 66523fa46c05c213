//! Keeps an eye on the PKCS#11 token (`keystore.pkcs11`): a token that stops answering is found within
//! [`CHECK_EVERY`] even when nothing is being signed, and one that was down is tried again as often.
//! While it is down nothing new is signed; what was issued keeps being served, and `/ready`, `/api/status`
//! and `meshca_keystore_token_up` say so. When it answers again, the resources are reloaded so that a
//! CA rotation that waited for the token goes ahead at once (renewals retry on their own).

use std::time::Duration;

use meshca_hsm::Token;
use tokio_util::sync::CancellationToken;

use super::reload::{Change, Reloader};

/// How often the token is asked whether it is there (a cheap call), or tried again while down.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Runs until `shutdown`.
pub(crate) async fn watch(token: Token, reloader: Reloader, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
        let was_up = token.status().up;
        let probe = token.clone();
        // PKCS#11 calls block: they run beside the runtime's workers.
        let up = tokio::task::spawn_blocking(move || match was_up {
            true => probe.check(),
            false => probe.recover(),
        })
        .await
        .unwrap_or(false);
        if up && !was_up && !reloader.apply(Change::Resources).await {
            return;
        }
    }
}
