//! JWT-SVID signing keys in a real SoftHSM2 token (`keystore.pkcs11`), through a whole rotation: made in
//! the token (the keystore keeps only their URI and public key), signing there, loaded again by a restart,
//! succeeded, and destroyed in the token when retired. SoftHSM2 reads `SOFTHSM2_CONF` when its module is
//! initialised, so this binary sets it before any thread starts and has no test harness.

use std::sync::Arc;
use std::time::Duration;

use meshca_config::MAX_JWT_SVID_EXPIRY;
use meshca_keystore::{Keystore, MemoryKeystore, WithToken};
use meshca_testhsm::TestToken;
use meshca_workload::jwt::{mint, validate};
use meshca_workload::jwt_keys::{Clock, JwtKeys};
use meshca_workload::WorkloadOptions;
use tokio::time::Instant;
use zeroize::Zeroizing;

const TD: &str = "example.org";
const LIFETIME: Duration = Duration::from_secs(3600);
/// Unix milliseconds at the start of the test's clock.
const EPOCH_MS: u64 = 1_800_000_000_000;

fn main() {
    let token = TestToken::new();
    // Nothing else runs yet: the variable is set before any thread could read the environment.
    for (name, value) in token.env() {
        std::env::set_var(name, value);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(a_rotation_makes_signs_and_destroys_its_keys_in_the_token(
        &token,
    ));
    println!("test a_rotation_makes_signs_and_destroys_its_keys_in_the_token ... ok");
}

/// The entries of key `number`.
fn entries(keystore: &dyn Keystore, number: u64) -> Vec<String> {
    keystore
        .list(&format!("jwt-svid/{TD}/{number}"))
        .expect("the keystore lists")
        .into_iter()
        .filter(|name| {
            name.strip_prefix(&format!("jwt-svid/{TD}/{number}"))
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
        .collect()
}

fn kids(keys: &JwtKeys) -> Vec<(u64, String)> {
    keys.status()
        .into_iter()
        .map(|status| (status.number, status.kid))
        .collect()
}

async fn a_rotation_makes_signs_and_destroys_its_keys_in_the_token(token: &TestToken) {
    let pkcs11 = meshca_hsm::Token::open(
        &token.module(),
        token.label(),
        Zeroizing::new(token.pin().to_owned()),
    )
    .expect("the token opens");
    let keystore: Arc<dyn Keystore> =
        Arc::new(WithToken::new(MemoryKeystore::new(), pkcs11.clone()));
    let options = WorkloadOptions {
        ack_after: Duration::from_secs(1),
        jwt_key_lifetime: LIFETIME,
        ..WorkloadOptions::default()
    };
    let start = Instant::now();
    let clock: Clock = Arc::new(move || EPOCH_MS + (Instant::now() - start).as_millis() as u64);

    // The first key is made in the token: the keystore holds its URI, public key and record, no key.
    let keys = JwtKeys::load_with_clock(keystore.clone(), &options, clock.clone())
        .await
        .expect("loads");
    keys.ensure(TD).await.expect("the first key is made");
    assert_eq!(token.object_count(), 2, "one key pair in the token");
    assert_eq!(
        entries(keystore.as_ref(), 1),
        [
            format!("jwt-svid/{TD}/1.json"),
            format!("jwt-svid/{TD}/1.pkcs11"),
            format!("jwt-svid/{TD}/1.pub.pem"),
        ]
    );
    let uri = keystore
        .get_public(&format!("jwt-svid/{TD}/1.pkcs11"))
        .expect("reads")
        .expect("the URI");
    assert!(
        String::from_utf8_lossy(&uri).contains(&format!("object=meshca%20jwt-svid%2F{TD}%2F1")),
        "labelled for good once recorded: {}",
        String::from_utf8_lossy(&uri)
    );

    // It signs in the token, and what it signs validates with the published key.
    let signer = keys
        .signer(TD, Instant::now() + Duration::from_secs(10))
        .await
        .expect("a signer, once ackAfter passed");
    let now_s = clock() / 1000;
    let jwt = mint(
        &signer,
        &format!("spiffe://{TD}/w"),
        &["a".to_owned()],
        now_s,
        now_s + 300,
    )
    .expect("minted in the token");
    let published = keys.current();
    validate(
        &jwt,
        "a",
        &|td: &str, kid: &str| published.get(td, kid),
        now_s,
    )
    .expect("validates with the published key");

    // A restart loads the same key from the token.
    let restarted = JwtKeys::load_with_clock(keystore.clone(), &options, clock.clone())
        .await
        .expect("loads again");
    assert_eq!(kids(&restarted), kids(&keys));
    drop(restarted);

    // Past its lifetime a successor is made, in the token too.
    tokio::time::advance(LIFETIME).await;
    keys.tick().await.expect("a rotation round");
    let both = kids(&keys);
    assert_eq!(
        both.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        [1, 2],
        "{both:?}"
    );
    assert_eq!(token.object_count(), 4, "two key pairs");

    // Once every token key 1 may have signed has expired, it is retired: its entries are deleted and
    // its pair destroyed in the token.
    tokio::time::advance(MAX_JWT_SVID_EXPIRY + Duration::from_secs(3600)).await;
    keys.tick().await.expect("a retiring round");
    // (Key 2 outlived its own lifetime meanwhile, so key 3 was made in the same round.)
    let left = kids(&keys);
    assert_eq!(
        left.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        [2, 3],
        "{left:?}"
    );
    assert!(
        entries(keystore.as_ref(), 1).is_empty(),
        "{:?}",
        entries(keystore.as_ref(), 1)
    );
    assert_eq!(
        token.object_count(),
        4,
        "key 1's pair is destroyed, keys 2 and 3 are in the token"
    );
    assert_eq!(left[0].1, both[1].1, "key 2 stays");
}
