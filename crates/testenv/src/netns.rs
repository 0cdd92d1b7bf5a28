//! A network namespace joined to the root one by a veth pair, so that a test can cut one
//! process off from one address and leave its other paths alone (a partition).
//!
//! ```text
//!   root namespace                              namespace `sy-<pid>`
//!   everything else on 127.0.0.1
//!   outer  10.213.N.1/24 ──── veth pair ──── inner  10.213.N.2/24   (the partitioned process)
//!   aside  10.213.N.5/32  (a second address on the outer end, what `cut` blackholes)
//! ```
//!
//! The namespace's `/etc/hosts` is the test's own (`ip netns exec` mounts
//! `/etc/netns/<name>/hosts` over it), so `localhost` there can name `aside`: a service whose
//! certificate is valid for `localhost` is then reached through the veth. Everything is
//! deleted on drop, also when the test panics; a namespace left by a killed run of the same
//! process id is deleted before a new one is made. Needs `ip` (iproute2) and CAP_NET_ADMIN.

use std::{net::Ipv4Addr, path::PathBuf, process::Command};

use crate::{Error, Result};

/// A network namespace with a veth pair to the root namespace; deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
    veth: String,
    subnet: u8,
}

impl NetNs {
    /// Creates the namespace and the veth pair, with private addresses in 10.213.N.0/24
    /// (N from the process id, so that two test processes do not collide).
    pub fn create() -> Result<Self> {
        let pid = std::process::id();
        let netns = Self {
            name: format!("sy-{pid}"),
            veth: format!("sy{pid}o"),
            subnet: u8::try_from(pid % 250).unwrap_or(0) + 1,
        };
        netns.remove();
        let inner_veth = format!("sy{pid}i");
        let outer = format!("{}/24", netns.outer());
        let inner = format!("{}/24", netns.inner());
        let aside = format!("{}/32", netns.aside());
        ip(&["netns", "add", &netns.name])?;
        let steps: [&[&str]; 8] = [
            &[
                "link",
                "add",
                &netns.veth,
                "type",
                "veth",
                "peer",
                "name",
                &inner_veth,
            ],
            &["link", "set", &inner_veth, "netns", &netns.name],
            &["addr", "add", &outer, "dev", &netns.veth],
            &["addr", "add", &aside, "dev", &netns.veth],
            &["link", "set", &netns.veth, "up"],
            &["-n", &netns.name, "addr", "add", &inner, "dev", &inner_veth],
            &["-n", &netns.name, "link", "set", &inner_veth, "up"],
            &["-n", &netns.name, "link", "set", "lo", "up"],
        ];
        for step in steps {
            ip(step)?;
        }
        // The inner end reaches `aside` through the veth (the root namespace owns it).
        ip(&[
            "-n",
            &netns.name,
            "route",
            "add",
            &aside,
            "via",
            &netns.outer().to_string(),
        ])?;
        Ok(netns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The root namespace's end of the veth.
    pub fn outer(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.subnet, 1)
    }

    /// The namespace's end of the veth: where a process inside listens.
    pub fn inner(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.subnet, 2)
    }

    /// A second root-namespace address, reached from inside through the veth; [`Self::cut`]
    /// makes it unreachable from inside and leaves `outer` alone.
    pub fn aside(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.subnet, 5)
    }

    /// Makes `localhost` name [`Self::aside`] for processes started inside.
    pub fn localhost_is_aside(&self) -> Result<()> {
        std::fs::create_dir_all(self.etc())?;
        std::fs::write(
            self.etc().join("hosts"),
            format!("{} localhost\n", self.aside()),
        )?;
        Ok(())
    }

    /// From inside, every packet to [`Self::aside`] is dropped silently (a blackhole route):
    /// open connections stall, as across a real partition.
    pub fn cut(&self) -> Result<()> {
        self.route("replace", "blackhole")
    }

    /// Undoes [`Self::cut`].
    pub fn heal(&self) -> Result<()> {
        self.route("replace", "unicast")
    }

    fn route(&self, verb: &str, kind: &str) -> Result<()> {
        let aside = format!("{}/32", self.aside());
        let outer = self.outer().to_string();
        let mut args = vec!["-n", &self.name, "route", verb, kind, &aside];
        if kind == "unicast" {
            args.extend(["via", &outer]);
        }
        ip(&args)
    }

    /// `program` run inside the namespace: the command line to spawn.
    pub(crate) fn wrap(&self) -> Vec<String> {
        ["netns", "exec", &self.name]
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    fn etc(&self) -> PathBuf {
        PathBuf::from("/etc/netns").join(&self.name)
    }

    fn remove(&self) {
        // Deleting one end of a veth pair deletes both; errors mean it was not there.
        let _ = ip(&["link", "del", &self.veth]);
        let _ = ip(&["netns", "del", &self.name]);
        let _ = std::fs::remove_dir_all(self.etc());
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        self.remove();
    }
}

fn ip(args: &[&str]) -> Result<()> {
    let output = Command::new("ip").args(args).output().map_err(|e| {
        Error::Setup(format!(
            "ip {}: {e} (iproute2 is needed; scripts/testenv.sh build installs it)",
            args.join(" ")
        ))
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Setup(format!(
            "ip {}: {} (needs CAP_NET_ADMIN)",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}
