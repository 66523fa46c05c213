//! A private temporary directory for a drill's in-process daemon: data, resources and SDS socket.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use meshca_config::{ListenAddr, Settings};

/// A directory under the system temp dir, removed (best effort) when dropped.
#[derive(Debug)]
pub struct Sandbox {
    root: PathBuf,
}

impl Sandbox {
    /// Creates `<tmp>/meshca-drill-<pid>-<nanos>` (mode 0700) with an empty `resources/`.
    pub fn new() -> anyhow::Result<Sandbox> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let root =
            std::env::temp_dir().join(format!("meshca-drill-{}-{nanos:09}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&root)
            .with_context(|| format!("cannot create the drill directory {}", root.display()))?;
        let sandbox = Sandbox { root };
        std::fs::create_dir(sandbox.resources())
            .with_context(|| format!("cannot create {}", sandbox.resources().display()))?;
        Ok(sandbox)
    }

    fn resources(&self) -> PathBuf {
        self.root.join("resources")
    }

    /// Settings for a daemon living in the sandbox: SDS and the Workload API on unix sockets only,
    /// admin on a free loopback port, the embedded defaults otherwise.
    pub fn settings(&self) -> Settings {
        let data_dir = self.root.join("data");
        let mut settings = Settings::default();
        settings.sds.listen = vec![ListenAddr::Unix(self.root.join("sds.sock"))];
        settings.sds.tls = None;
        settings.sds.insecure = false;
        settings.workload_api.listen = vec![self.root.join("workload.sock")];
        settings.admin.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        settings.resources = self.resources();
        settings.data_dir = data_dir;
        settings
    }

    /// [`Sandbox::settings`], with CA keys in the PKCS#11 token `pkcs11` names.
    pub fn settings_with_token(&self, pkcs11: &meshca_config::Pkcs11Settings) -> Settings {
        let mut settings = self.settings();
        settings.keystore.pkcs11 = Some(pkcs11.clone());
        settings
    }

    /// Replaces a resource file whole (written beside the directory, then renamed in).
    pub fn write_resource(&self, name: &str, yaml: &str) -> anyhow::Result<()> {
        let staging = self.root.join(format!(".staging-{name}"));
        std::fs::write(&staging, yaml)
            .with_context(|| format!("cannot write {}", staging.display()))?;
        std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot restrict {}", staging.display()))?;
        let target = self.resources().join(name);
        std::fs::rename(&staging, &target)
            .with_context(|| format!("cannot replace {}", target.display()))
    }

    /// Removes a resource file.
    pub fn remove_resource(&self, name: &str) -> anyhow::Result<()> {
        let target = self.resources().join(name);
        std::fs::remove_file(&target).with_context(|| format!("cannot remove {}", target.display()))
    }

    /// The sandbox root.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.root) {
            tracing::warn!(dir = %self.root.display(), "cannot remove the drill directory: {error}");
        }
    }
}
