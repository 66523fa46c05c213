//! One PKCS#11 token, opened by its label and logged in, with a pool of sessions so that signatures made
//! on several threads at once run in parallel on an HSM that can.
//!
//! A token can go away while meshca runs (a network HSM unreachable, a USB token pulled, SoftHSM2's
//! directory moved). An operation that fails checks whether the token still answers; when it does not,
//! the token is marked down: every operation is refused at once with [`HsmError::Unavailable`] until
//! [`Token::recover`] reaches it again (the daemon calls it on a timer). Recovering finalises the module
//! and initialises it again, as some modules (SoftHSM2 among them) only see a returned token then.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::SystemTime;

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::Slot;
use cryptoki::types::AuthPin;
use zeroize::Zeroizing;

use crate::error::HsmError;
use crate::module_file;

/// A PKCS#11 token, logged in. Cloning shares it. `Debug` shows the module and the label, never the PIN.
#[derive(Clone)]
pub struct Token {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    module: PathBuf,
    label: String,
    pin: Zeroizing<String>,
    /// The module's context while the token answers; `None` while it is down.
    context: RwLock<Option<Context>>,
    status: Mutex<TokenStatus>,
    /// Counts the contexts opened, so that object handles found in an earlier one are not reused.
    generations: AtomicU64,
    /// Why the token refused the PIN when it was reached again, if it did: from then on this process
    /// never logs in again, since a token locks its user PIN after a few wrong attempts.
    login_refused: Mutex<Option<String>>,
}

/// An initialised module and the slot holding the token.
pub(crate) struct Context {
    pkcs11: Pkcs11,
    slot: Slot,
    /// The session that logged in, kept open for the context's life: PKCS#11 logs the application
    /// out when its last session closes, and sessions of the pool are closed after a failure.
    _login: Mutex<Session>,
    /// Sessions not in use; each operation takes one, or opens one when none is free.
    idle: Mutex<Vec<Session>>,
    pub(crate) generation: u64,
}

/// Whether the token answers, since when, and why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenStatus {
    /// The token answers and signs.
    pub up: bool,
    /// When it last went up or down.
    pub since: SystemTime,
    /// Why it is down (the last failure), when it is.
    pub reason: Option<String>,
}

/// The modules this process has opened: PKCS#11 allows one initialisation of a module per process, so
/// a second [`Token::open`] of the same module and label shares the first.
static OPEN: Mutex<Vec<(PathBuf, Weak<Inner>)>> = Mutex::new(Vec::new());

impl Token {
    /// Loads `module`, finds the token labelled `label` and logs in with `pin`. Each failure says what
    /// to check: the module path, the label (listing the tokens present), the PIN.
    pub fn open(module: &Path, label: &str, pin: Zeroizing<String>) -> Result<Token, HsmError> {
        let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|(_, inner)| inner.strong_count() > 0);
        if let Some(inner) = open
            .iter()
            .filter(|(path, _)| path == module)
            .find_map(|(_, inner)| inner.upgrade())
        {
            if inner.label != label {
                return Err(HsmError::AlreadyOpen {
                    module: module.to_owned(),
                    label: inner.label.clone(),
                });
            }
            return Ok(Token { inner });
        }
        let context = Context::open(module, label, &pin, 1)?;
        let inner = Arc::new(Inner {
            module: module.to_owned(),
            label: label.to_owned(),
            pin,
            context: RwLock::new(Some(context)),
            status: Mutex::new(TokenStatus {
                up: true,
                since: SystemTime::now(),
                reason: None,
            }),
            generations: AtomicU64::new(1),
            login_refused: Mutex::new(None),
        });
        open.push((module.to_owned(), Arc::downgrade(&inner)));
        Ok(Token { inner })
    }

    /// The token's label.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// The module's path.
    pub fn module(&self) -> &Path {
        &self.inner.module
    }

    /// Whether the token answers.
    pub fn status(&self) -> TokenStatus {
        self.inner
            .status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Asks the token whether it is still there (a cheap call); marks it down when it is not, so that a
    /// token lost while nothing is signed shows at once. `true` when it answers.
    pub fn check(&self) -> bool {
        if self.answers() {
            return true;
        }
        if self.status().up {
            self.mark_down("the token no longer answers".into());
        }
        false
    }

    /// When the token is down, tries to reach it again; `true` when it is up afterwards.
    ///
    /// A token that answers but refuses the PIN (or has locked it) is not tried again by this process:
    /// each try would be one more wrong attempt, and an HSM locks its user PIN after a few. The status
    /// says so until meshca is restarted with the right PIN.
    pub fn recover(&self) -> bool {
        let mut context = self
            .inner
            .context
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if context.is_some() {
            return true;
        }
        if self
            .inner
            .login_refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
        {
            return false;
        }
        let generation = self.inner.generations.fetch_add(1, Ordering::Relaxed) + 1;
        match Context::open(
            &self.inner.module,
            &self.inner.label,
            &self.inner.pin,
            generation,
        ) {
            Ok(opened) => {
                *context = Some(opened);
                drop(context);
                tracing::info!(token = %self.inner.label, "the PKCS#11 token answers again: signing resumes");
                self.set_status(true, None);
                true
            }
            Err(error) => {
                let refused = matches!(
                    error,
                    HsmError::WrongPin { .. } | HsmError::PinLocked { .. }
                );
                let reason = match refused {
                    true => {
                        let reason = format!(
                            "{error}; the PIN is not tried again (a token locks its PIN after a few wrong \
                             attempts): restart meshca once the PIN is right"
                        );
                        tracing::error!(token = %self.inner.label, "the PKCS#11 token answers again but refuses the PIN: {reason}");
                        *self
                            .inner
                            .login_refused
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner) = Some(reason.clone());
                        reason
                    }
                    false => error.to_string(),
                };
                let mut status = self
                    .inner
                    .status
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                status.reason = Some(reason);
                false
            }
        }
    }

    /// Runs `op` in a session of the token. When it fails and the token no longer answers, the token is
    /// marked down and the error is [`HsmError::Unavailable`]; when the token still answers, `op` is run
    /// once more in a fresh session (an object handle may have gone stale) before its error is returned.
    pub(crate) fn run<T>(
        &self,
        what: &'static str,
        op: impl Fn(&Context, &Session) -> Result<T, CkError>,
    ) -> Result<T, HsmError> {
        let mut last = None;
        for _ in 0..2 {
            let outcome = {
                let context = self
                    .inner
                    .context
                    .read()
                    .unwrap_or_else(PoisonError::into_inner);
                let Some(context) = context.as_ref() else {
                    return Err(self.unavailable());
                };
                context.with_session(|session| op(context, session))
            };
            match outcome {
                Ok(value) => return Ok(value),
                Err(error) => {
                    if !self.answers() {
                        self.mark_down(format!("{what}: {error}"));
                        return Err(self.unavailable());
                    }
                    last = Some(error);
                }
            }
        }
        Err(HsmError::Pkcs11 {
            what,
            error: last.expect("the loop ran at least once and failed"),
        })
    }

    /// Whether the token still answers with its label.
    fn answers(&self) -> bool {
        let context = self
            .inner
            .context
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        context.as_ref().is_some_and(|c| {
            c.pkcs11
                .get_token_info(c.slot)
                .is_ok_and(|info| info.label().trim_end() == self.inner.label)
        })
    }

    fn mark_down(&self, reason: String) {
        let taken = self
            .inner
            .context
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(context) = taken {
            context.close();
            tracing::error!(token = %self.inner.label, module = %self.inner.module.display(), reason = %reason,
                "the PKCS#11 token does not answer: no new certificate is signed until it does; what is issued keeps being served");
            self.set_status(false, Some(reason));
        }
    }

    fn set_status(&self, up: bool, reason: Option<String>) {
        *self
            .inner
            .status
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = TokenStatus {
            up,
            since: SystemTime::now(),
            reason,
        };
    }

    fn unavailable(&self) -> HsmError {
        HsmError::Unavailable {
            label: self.inner.label.clone(),
            reason: self.status().reason.unwrap_or_default(),
        }
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("module", &self.inner.module)
            .field("label", &self.inner.label)
            .finish_non_exhaustive()
    }
}

impl Context {
    fn open(
        module: &Path,
        label: &str,
        pin: &Zeroizing<String>,
        generation: u64,
    ) -> Result<Context, HsmError> {
        let module_error = |reason: String| HsmError::Module {
            module: module.to_owned(),
            reason,
        };
        module_file::check(module).map_err(module_error)?;
        let pkcs11 = Pkcs11::new(module).map_err(|e| module_error(e.to_string()))?;
        match pkcs11.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)) {
            Ok(()) | Err(CkError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
            Err(e) => return Err(module_error(format!("initialising it failed: {e}"))),
        }
        let opened = Self::find_and_login(&pkcs11, label, pin);
        match opened {
            Ok((slot, login)) => Ok(Context {
                pkcs11,
                slot,
                _login: Mutex::new(login),
                idle: Mutex::new(Vec::new()),
                generation,
            }),
            Err(error) => {
                let _ = pkcs11.finalize();
                Err(error)
            }
        }
    }

    fn find_and_login(
        pkcs11: &Pkcs11,
        label: &str,
        pin: &Zeroizing<String>,
    ) -> Result<(Slot, Session), HsmError> {
        let slots = pkcs11
            .get_slots_with_token()
            .map_err(|error| HsmError::Pkcs11 {
                what: "listing the slots",
                error,
            })?;
        let mut present = Vec::new();
        let mut found = None;
        for slot in slots {
            let Ok(info) = pkcs11.get_token_info(slot) else {
                continue;
            };
            let name = info.label().trim_end().to_owned();
            if name == label && found.is_none() {
                found = Some(slot);
            }
            if !name.is_empty() {
                present.push(name);
            }
        }
        let Some(slot) = found else {
            return Err(HsmError::NoToken {
                label: label.to_owned(),
                present,
            });
        };
        let session = pkcs11
            .open_rw_session(slot)
            .map_err(|error| HsmError::Pkcs11 {
                what: "opening a session",
                error,
            })?;
        let secret = AuthPin::from(pin.as_str());
        match session.login(UserType::User, Some(&secret)) {
            Ok(()) | Err(CkError::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => Ok((slot, session)),
            Err(CkError::Pkcs11(
                RvError::PinIncorrect | RvError::PinInvalid | RvError::PinLenRange,
                _,
            )) => Err(HsmError::WrongPin {
                label: label.to_owned(),
            }),
            Err(CkError::Pkcs11(RvError::PinLocked, _)) => Err(HsmError::PinLocked {
                label: label.to_owned(),
            }),
            Err(error) => Err(HsmError::Pkcs11 {
                what: "logging in",
                error,
            }),
        }
    }

    /// Runs `op` in an idle session, or a new one; a session whose operation failed is closed rather
    /// than reused.
    fn with_session<T>(
        &self,
        op: impl FnOnce(&Session) -> Result<T, CkError>,
    ) -> Result<T, CkError> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let session = match idle {
            Some(session) => session,
            None => self.pkcs11.open_rw_session(self.slot)?,
        };
        let outcome = op(&session);
        if outcome.is_ok() {
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(session);
        }
        outcome
    }

    /// Closes every session and finalises the module.
    fn close(self) {
        let Context {
            pkcs11,
            _login,
            idle,
            ..
        } = self;
        drop(idle);
        drop(_login);
        let _ = pkcs11.finalize();
    }
}
