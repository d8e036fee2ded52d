//! A multi-host fleet's broker side for tests (issue 20): a virtual host of its own on the
//! machine's RabbitMQ, provisioned the way an administrator would — `fleetd gateway provision`
//! (the built binary) loaded with `rabbitmqctl import_definitions` — with each gateway's user
//! and password, and deleted (vhost and users) when dropped. The shared broker itself is never
//! restarted or reconfigured. [`Ctl`] says which node `rabbitmqctl` talks to: the shared one, or
//! a node of a test's own cluster (`crate::cluster`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, ensure};

use crate::{RABBITMQ_ADDR, Service, require};

/// Requires `rabbitmqctl` (tests that provision a vhost run it, as root or the broker's user).
pub fn require_rabbitmqctl() -> Service {
    let found = Command::new("rabbitmqctl")
        .arg("status")
        .output()
        .is_ok_and(|o| o.status.success());
    require(
        "rabbitmqctl talking to the local RabbitMQ",
        found,
        "Run the tests as root (or the rabbitmq user) on the machine whose RabbitMQ .ci/run started.",
    )
}

/// How to run `rabbitmqctl` against one node, and where that node takes AMQP connections.
#[derive(Debug, Clone)]
pub struct Ctl {
    program: PathBuf,
    node: Option<String>,
    env: Vec<(String, OsString)>,
    /// The node's AMQP address (`host:port`).
    pub amqp: String,
}

impl Ctl {
    /// The machine's own broker (`rabbitmqctl` on PATH, its default node, [`RABBITMQ_ADDR`]).
    pub fn local() -> Self {
        Self {
            program: PathBuf::from("rabbitmqctl"),
            node: None,
            env: Vec::new(),
            amqp: RABBITMQ_ADDR.to_owned(),
        }
    }

    /// `program -n node`, run with `env` (a cluster node's cookie HOME and env file).
    pub fn node(program: PathBuf, node: &str, env: Vec<(String, OsString)>, amqp: String) -> Self {
        Self {
            program,
            node: Some(node.to_owned()),
            env,
            amqp,
        }
    }

    /// The node's name, when one was given (`None`: the tool's default node).
    pub fn node_name(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// Runs `rabbitmqctl [-n node] args...`; its stdout.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut command = Command::new(&self.program);
        if let Some(node) = &self.node {
            command.args(["-n", node]);
        }
        let out = command
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .with_context(|| format!("{}", self.program.display()))?;
        ensure!(
            out.status.success(),
            "rabbitmqctl {}{args:?}: {}{}",
            self.node
                .as_ref()
                .map_or_else(String::new, |n| format!("-n {n} ")),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// A provisioned vhost with its gateways' users.
#[derive(Debug)]
pub struct FleetVhost {
    /// The vhost's name.
    pub vhost: String,
    /// The gateways, in the order given.
    pub gateways: Vec<String>,
    /// Where each gateway's password file is (`<dir>/<name>`).
    pub passwords: PathBuf,
    /// The node it was provisioned through, and is deleted through when dropped.
    pub ctl: Ctl,
    /// The definitions document `fleetd gateway provision` printed for it.
    definitions: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl FleetVhost {
    /// Provisions `gateways` (names made unique per process: `<name><pid>`) in a vhost of their
    /// own on the machine's broker.
    pub fn provision(gateways: &[&str]) -> anyhow::Result<Self> {
        Self::provision_with(&Ctl::local(), gateways)
    }

    /// Like [`FleetVhost::provision`], through the node `ctl` names (a cluster's: the
    /// definitions are the cluster's once one node has them).
    pub fn provision_with(ctl: &Ctl, gateways: &[&str]) -> anyhow::Result<Self> {
        let pid = std::process::id();
        let unique: Vec<String> = gateways.iter().map(|g| format!("{g}{pid}")).collect();
        // A vhost name travels in AMQP's `connection.open` as a short string (255 bytes at
        // most): a large simulated fleet is named by its size.
        let joined = unique.join("-");
        let vhost = if joined.len() <= 200 {
            format!("fleet-t{pid}-{joined}")
        } else {
            format!("fleet-t{pid}-{}-gateways-{}", unique.len(), unique[0])
        };
        let dir = tempfile::tempdir()?;
        let passwords = dir.path().join("passwords");
        std::fs::create_dir(&passwords)?;
        let out = Command::new(crate::daemon::fleetd_binary())
            .args([
                "gateway",
                "provision",
                "--vhost",
                &vhost,
                "--gateways",
                &unique.join(","),
            ])
            .arg("--passwords-dir")
            .arg(&passwords)
            .output()
            .context("fleetd gateway provision")?;
        ensure!(
            out.status.success(),
            "fleetd gateway provision: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        import(ctl, &out.stdout)?;
        let this = Self {
            vhost,
            gateways: unique,
            passwords,
            ctl: ctl.clone(),
            definitions: out.stdout,
            _dir: dir,
        };
        // The import is asynchronous: wait until the last gateway's queue is there.
        let last = this.gateways.last().cloned().unwrap_or_default();
        let queue = format!("fleet.gw.{last}.in");
        crate::wait_until(
            "the provisioned queues",
            std::time::Duration::from_secs(30),
            || {
                this.ctl
                    .run(&["list_queues", "-p", &this.vhost, "name"])
                    .is_ok_and(|out| out.contains(&queue))
            },
        );
        Ok(this)
    }

    /// Loads the same definitions again (the broker adds what is missing: a deleted queue comes
    /// back, nothing else changes).
    pub fn import_again(&self) -> anyhow::Result<()> {
        import(&self.ctl, &self.definitions)
    }

    /// Gateway `i`'s password.
    pub fn password(&self, i: usize) -> String {
        std::fs::read_to_string(self.password_file(i))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// Gateway `i`'s password file (for its `passwordSecret`).
    pub fn password_file(&self, i: usize) -> PathBuf {
        self.passwords.join(&self.gateways[i])
    }

    /// An AMQP URL for gateway `i` to this vhost (through `addr`, default the node it was
    /// provisioned through).
    pub fn url(&self, i: usize, addr: Option<&str>) -> String {
        format!(
            "amqp://{}:{}@{}/{}",
            self.gateways[i],
            self.password(i),
            addr.unwrap_or(&self.ctl.amqp),
            self.vhost
        )
    }

    /// The directory holding the password files.
    pub fn passwords_dir(&self) -> &Path {
        &self.passwords
    }

    /// The `gateway:` block (and its password secret) of a fleetd that is gateway `me` of two:
    /// its broker URLs are `brokers` (`host:port`s, a proxy or a node, tried in turn), presence
    /// every second, and the other gateway may ask `peer_rights` (`send, stop, spawn`).
    pub fn gateway_block(&self, me: usize, peer_rights: &str, brokers: &[String]) -> String {
        self.gateway_block_with(me, peer_rights, brokers, "")
    }

    /// [`FleetVhost::gateway_block`] with `tls` (the `tls:` lines of `broker:`, indented by
    /// four) and brokers that may be whole `amqps://host:port` prefixes.
    pub fn gateway_block_with(
        &self,
        me: usize,
        peer_rights: &str,
        brokers: &[String],
        tls: &str,
    ) -> String {
        self.block(me, peer_rights, brokers, tls, 1)
    }

    /// [`FleetVhost::gateway_block`] for gateway `me` of any number: every other gateway is a
    /// peer that may ask `peer_rights`, and presence goes out every `presence_secs` seconds.
    pub fn gateway_block_among(
        &self,
        me: usize,
        peer_rights: &str,
        brokers: &[String],
        presence_secs: u64,
    ) -> String {
        self.block(me, peer_rights, brokers, "", presence_secs)
    }

    fn block(
        &self,
        me: usize,
        peer_rights: &str,
        brokers: &[String],
        tls: &str,
        presence_secs: u64,
    ) -> String {
        let urls: Vec<String> = brokers
            .iter()
            .map(|b| {
                if b.contains("://") {
                    format!("{b}/{}", self.vhost)
                } else {
                    format!("amqp://{b}/{}", self.vhost)
                }
            })
            .collect();
        let peers: String = (self.gateways.iter().enumerate())
            .filter(|(i, _)| *i != me)
            .map(|(_, peer)| format!("    {peer}:\n      allow: [{peer_rights}]\n"))
            .collect();
        format!(
            "gateway:\n  name: {}\n  presenceIntervalSecs: {presence_secs}\n  broker:\n    urls: [{}]\n    passwordSecret: gw\n    heartbeatSecs: 5\n{tls}  peers:\n{peers}secrets:\n  gw:\n    file: {}\n",
            self.gateways[me],
            urls.join(", "),
            self.password_file(me).display(),
        )
    }
}

impl Drop for FleetVhost {
    fn drop(&mut self) {
        let _ = self.ctl.run(&["delete_vhost", &self.vhost]);
        for g in &self.gateways {
            let _ = self.ctl.run(&["delete_user", g]);
        }
    }
}

/// `import_definitions` of `definitions` through `ctl`.
fn import(ctl: &Ctl, definitions: &[u8]) -> anyhow::Result<()> {
    // rabbitmqctl reads the file as the broker's user: a world-readable place.
    let defs = tempfile::Builder::new()
        .prefix("fleet-defs-")
        .suffix(".json")
        .tempfile_in(std::env::temp_dir())?;
    std::fs::write(defs.path(), definitions)?;
    std::fs::set_permissions(
        defs.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    ctl.run(&["import_definitions", &defs.path().display().to_string()])
        .map(drop)
}

/// Runs `rabbitmqctl args...` against the machine's broker; its stdout.
pub fn rabbitmqctl(args: &[&str]) -> anyhow::Result<String> {
    Ctl::local().run(args)
}
