//! A RabbitMQ cluster of a test's own (issue 20's failover run; the recipe of the design notes'
//! "3-node cluster failover"): nodes `f1@localhost`, `f2@localhost`, … each on its own AMQP
//! and distribution port, with its data, logs and pid file in a temp dir, an Erlang cookie in a
//! HOME of the cluster's own, an empty `rabbitmq-env.conf` (the machine's pins
//! `rabbit@localhost` and port 5672) and no plugins; every node after the first joined to the
//! first. The nodes are stopped when the cluster is dropped, also when the test panics:
//! `rabbitmqctl -n fN@localhost stop`, or SIGKILL to that node's own pid when it does not
//! answer. It shares only epmd with the machine's broker, whose node, port, cookie and files it
//! never touches.

use std::ffi::OsString;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

use crate::broker::Ctl;
use crate::{Service, require};

/// Longest wait for a node to boot (about 12 s each on two busy cores, three in parallel).
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// Where the broker's own scripts are: `FLEETD_RABBITMQ_SBIN` when set, else Debian's
/// `/usr/lib/rabbitmq/bin` (not `/usr/sbin`, whose wrappers switch to the `rabbitmq` user and
/// its HOME, hence its cookie), else the directory of `rabbitmq-server` on PATH.
pub fn sbin() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("FLEETD_RABBITMQ_SBIN") {
        return Some(PathBuf::from(dir));
    }
    let debian = PathBuf::from("/usr/lib/rabbitmq/bin");
    if debian.join("rabbitmq-server").exists() {
        return Some(debian);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path).find(|dir| dir.join("rabbitmq-server").exists())
    })
}

/// Requires RabbitMQ's server scripts (to boot nodes of a test's own).
pub fn require_rabbitmq_server() -> Service {
    require(
        "rabbitmq-server",
        sbin().is_some(),
        "Install RabbitMQ (`apt-get install -y rabbitmq-server`), or set FLEETD_RABBITMQ_SBIN to \
         the directory holding rabbitmq-server and rabbitmqctl.",
    )
}

/// One node.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its Erlang node name (`f1@localhost`).
    pub name: String,
    /// Its AMQP port.
    pub amqp_port: u16,
    /// Its distribution port.
    pub dist_port: u16,
    dir: PathBuf,
    killed: bool,
}

impl Node {
    /// Its AMQP address (`127.0.0.1:port`).
    pub fn amqp(&self) -> String {
        format!("127.0.0.1:{}", self.amqp_port)
    }
}

/// A running cluster, stopped when dropped.
#[derive(Debug)]
pub struct Cluster {
    sbin: PathBuf,
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Boots `n` nodes (in parallel) on AMQP ports `amqp_port..` and distribution ports
    /// `dist_port..`, and joins every node after the first to the first.
    pub fn boot(n: u16, amqp_port: u16, dist_port: u16) -> anyhow::Result<Self> {
        let sbin = sbin().context("no rabbitmq-server found")?;
        for port in (amqp_port..amqp_port + n).chain(dist_port..dist_port + n) {
            ensure!(
                TcpStream::connect(("127.0.0.1", port)).is_err(),
                "port {port} is taken: a node an earlier run left behind? Find it with \
                 `ps -eo pid,args | grep 'f[0-9]@localhost'` and kill that pid"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("fleetd-cluster-")
            .tempdir()?;
        let home = dir.path().join("home");
        std::fs::create_dir(&home)?;
        let cookie = home.join(".erlang.cookie");
        let secret: String = std::iter::repeat_with(fastrand::alphabetic)
            .take(32)
            .collect();
        std::fs::write(&cookie, secret.to_uppercase())?;
        // Erlang refuses a cookie file others may read.
        std::fs::set_permissions(&cookie, std::os::unix::fs::PermissionsExt::from_mode(0o400))?;
        std::fs::write(dir.path().join("rabbitmq-env.conf"), "")?;
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n")?;
        let nodes = (0..n)
            .map(|i| Node {
                name: format!("f{}@localhost", i + 1),
                amqp_port: amqp_port + i,
                dist_port: dist_port + i,
                dir: dir.path().join(format!("f{}", i + 1)),
                killed: false,
            })
            .collect();
        // Built before any node starts, so that a failure from here on stops what did start.
        let cluster = Self { sbin, nodes, dir };
        for i in 0..cluster.nodes.len() {
            cluster.start(i)?;
        }
        for i in 0..cluster.nodes.len() {
            cluster.await_startup(i)?;
        }
        for i in 1..cluster.nodes.len() {
            let ctl = cluster.ctl(i);
            ctl.run(&["stop_app"])?;
            ctl.run(&["join_cluster", &cluster.nodes[0].name])?;
            ctl.run(&["start_app"])?;
        }
        let status = cluster
            .ctl(0)
            .run(&["cluster_status", "--formatter", "json"])?;
        let running: serde_json::Value = serde_json::from_str(&status)
            .with_context(|| format!("cluster_status is not JSON: {status}"))?;
        let running = running["running_nodes"].as_array().map_or(0, Vec::len);
        ensure!(
            running == cluster.nodes.len(),
            "{running} of {} nodes running after the joins: {status}",
            cluster.nodes.len()
        );
        Ok(cluster)
    }

    /// The nodes, `f1` first.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Which node is called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// `rabbitmqctl` against node `i`.
    pub fn ctl(&self, i: usize) -> Ctl {
        let node = &self.nodes[i];
        Ctl::node(
            self.sbin.join("rabbitmqctl"),
            &node.name,
            self.ctl_env(),
            node.amqp(),
        )
    }

    /// The node leading quorum queue `queue` of `vhost`, as node `via` sees it.
    pub fn leader(&self, via: usize, vhost: &str, queue: &str) -> anyhow::Result<String> {
        let out = self.ctl(via).run(&[
            "list_queues",
            "-p",
            vhost,
            "name",
            "leader",
            "--formatter",
            "json",
        ])?;
        let queues: serde_json::Value = serde_json::from_str(&out)
            .with_context(|| format!("list_queues is not JSON: {out}"))?;
        queues
            .as_array()
            .into_iter()
            .flatten()
            .find(|q| q["name"] == queue)
            .and_then(|q| q["leader"].as_str())
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .with_context(|| format!("no leader for {queue} in {out}"))
    }

    /// Node `i`'s OS process id, from its pid file, checked against the process's environment
    /// (this node's name and this cluster's HOME: a stale file never names somebody else's
    /// process).
    pub fn os_pid(&self, i: usize) -> anyhow::Result<u32> {
        let node = &self.nodes[i];
        let pid: u32 = std::fs::read_to_string(node.dir.join("pid"))
            .context("the node's pid file")?
            .trim()
            .parse()
            .context("the node's pid file holds a number")?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let home = format!("HOME={}", self.dir.path().join("home").display());
        let name = format!("RABBITMQ_NODENAME={}", node.name);
        let mut vars = environ.split(|b| *b == 0);
        ensure!(
            vars.clone().any(|v| v == name.as_bytes()) && vars.any(|v| v == home.as_bytes()),
            "pid {pid} is not node {} of this cluster",
            node.name
        );
        Ok(pid)
    }

    /// Kills node `i` with SIGKILL (no goodbye to its peers or clients) and waits until its
    /// process is gone.
    pub fn kill_9(&mut self, i: usize) -> anyhow::Result<()> {
        let pid = self.os_pid(i)?;
        signal_kill(pid)?;
        self.nodes[i].killed = true;
        crate::wait_until(
            &format!("node {} to die", self.nodes[i].name),
            Duration::from_secs(30),
            || !alive(pid),
        );
        Ok(())
    }

    /// Node `i`'s log file.
    pub fn log_file(&self, i: usize) -> PathBuf {
        let node = &self.nodes[i];
        node.dir.join("log").join(format!("{}.log", node.name))
    }

    /// The environment every node and every `rabbitmqctl` of this cluster runs with.
    fn ctl_env(&self) -> Vec<(String, OsString)> {
        vec![
            ("HOME".into(), self.dir.path().join("home").into()),
            (
                "RABBITMQ_CONF_ENV_FILE".into(),
                self.dir.path().join("rabbitmq-env.conf").into(),
            ),
            ("ERL_EPMD_ADDRESS".into(), "127.0.0.1".into()),
        ]
    }

    /// Starts node `i` detached (niced: it competes with the test for two cores).
    fn start(&self, i: usize) -> anyhow::Result<()> {
        let node = &self.nodes[i];
        std::fs::create_dir_all(&node.dir)?;
        let conf = node.dir.join("rabbitmq.conf");
        std::fs::write(&conf, "# a test node: everything from the environment\n")?;
        let path = |p: &Path| p.as_os_str().to_owned();
        let mut env = self.ctl_env();
        env.extend([
            ("RABBITMQ_NODENAME".into(), node.name.clone().into()),
            ("RABBITMQ_NODE_IP_ADDRESS".into(), "127.0.0.1".into()),
            (
                "RABBITMQ_NODE_PORT".into(),
                node.amqp_port.to_string().into(),
            ),
            (
                "RABBITMQ_DIST_PORT".into(),
                node.dist_port.to_string().into(),
            ),
            ("RABBITMQ_CONFIG_FILE".into(), path(&conf)),
            (
                "RABBITMQ_ADVANCED_CONFIG_FILE".into(),
                path(&node.dir.join("advanced.config")),
            ),
            (
                "RABBITMQ_MNESIA_BASE".into(),
                path(&node.dir.join("mnesia")),
            ),
            ("RABBITMQ_LOG_BASE".into(), path(&node.dir.join("log"))),
            ("RABBITMQ_PID_FILE".into(), path(&node.dir.join("pid"))),
            (
                "RABBITMQ_ENABLED_PLUGINS_FILE".into(),
                path(&self.dir.path().join("enabled_plugins")),
            ),
            (
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS".into(),
                "-kernel inet_dist_use_interface {127,0,0,1}".into(),
            ),
        ]);
        let out = std::fs::File::create(node.dir.join("startup.log"))?;
        let status = Command::new("nice")
            .arg(self.sbin.join("rabbitmq-server"))
            .arg("-detached")
            .envs(env)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .status()
            .context("rabbitmq-server")?;
        ensure!(
            status.success(),
            "rabbitmq-server -detached for {}: {status}",
            node.name
        );
        Ok(())
    }

    /// Waits until node `i` has booted. `await_startup` fails at once while the node is not
    /// registered with epmd yet, and each `rabbitmqctl` costs a second of CPU: it is asked only
    /// once the node's AMQP port answers.
    fn await_startup(&self, i: usize) -> anyhow::Result<()> {
        let node = &self.nodes[i];
        let mut last = None;
        let mut ready = false;
        crate::wait_until(&format!("node {} to boot", node.name), BOOT_TIMEOUT, || {
            if TcpStream::connect(node.amqp()).is_err() {
                return false;
            }
            match self.ctl(i).run(&["await_startup"]) {
                Ok(_) => ready = true,
                Err(e) => last = Some(e),
            }
            ready
        });
        if !ready {
            bail!("node {} did not boot: {last:?}", node.name);
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in (0..self.nodes.len()).rev() {
            if self.nodes[i].killed {
                continue;
            }
            let pid = self.os_pid(i).ok();
            if let Err(e) = self.ctl(i).run(&["stop"]) {
                eprintln!("cluster: stopping {} failed ({e:#})", self.nodes[i].name);
                if let Some(pid) = pid.filter(|p| alive(*p)) {
                    let _ = signal_kill(pid);
                }
            }
        }
    }
}

/// Sends SIGKILL to `pid`.
fn signal_kill(pid: u32) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .context("kill")?;
    ensure!(status.success(), "kill -KILL {pid}: {status}");
    Ok(())
}

/// Whether `pid` is a live process (a zombie is not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}
