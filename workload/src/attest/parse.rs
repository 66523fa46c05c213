//! The text of `/proc` files, parsed without I/O.
//!
//! Everything here reads what a caller can influence (its command name, its cgroup path) and what a
//! future kernel may change, so every function answers `None` on anything unexpected instead of
//! panicking, and the callers decide what a missing field means.

/// The four ids of a `Uid:` or `Gid:` line of `/proc/<pid>/status`: real, effective, saved and
/// filesystem, in the kernel's order.
pub(crate) fn status_ids(status: &str, key: &str) -> Option<[u32; 4]> {
    let values = status_value(status, key)?;
    let mut ids = [0u32; 4];
    let mut fields = values.split_ascii_whitespace();
    for id in &mut ids {
        *id = decimal_u32(fields.next()?)?;
    }
    match fields.next() {
        Some(_) => None,
        None => Some(ids),
    }
}

/// The supplementary group ids of the `Groups:` line of `/proc/<pid>/status` (possibly none).
pub(crate) fn status_groups(status: &str) -> Option<Vec<u32>> {
    status_value(status, "Groups")?
        .split_ascii_whitespace()
        .map(decimal_u32)
        .collect()
}

/// What the caller needs of `/proc/<pid>/stat`: the state letter (field 3) and the start time in
/// clock ticks after boot (field 22).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) state: char,
    pub(crate) starttime: u64,
}

impl Stat {
    /// A zombie (`Z`) or dead (`X`) process has exited: its pid is held only until it is reaped.
    pub(crate) fn has_exited(self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// Parses `/proc/<pid>/stat`. The second field is the command name in parentheses, which the
/// process chooses itself and may hold spaces and `)`; the fields after it hold neither, so they
/// start after the last `)`.
pub(crate) fn stat(text: &str) -> Option<Stat> {
    let open = text.find(" (")?;
    let close = text.rfind(')')?;
    if close < open {
        return None;
    }
    let mut fields = text.get(close + 1..)?.split_ascii_whitespace();
    // Field 3 is the first after the name; field 22 is 19 further on.
    let mut state = fields.next()?.chars();
    let letter = state.next()?;
    if state.next().is_some() {
        return None;
    }
    let starttime = fields.nth(18)?;
    Some(Stat {
        state: letter,
        starttime: decimal_u64(starttime)?,
    })
}

/// The `Pid:` line of `/proc/self/fdinfo/<pidfd>`: the pid the pidfd refers to in this pid
/// namespace, `-1` once that process has exited and been reaped, `0` when it is not visible here.
pub(crate) fn fdinfo_pid(fdinfo: &str) -> Option<i64> {
    let value = status_value(fdinfo, "Pid")?.trim();
    let (negative, digits) = match value.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, value),
    };
    let magnitude = i64::try_from(decimal_u64(digits)?).ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

/// The systemd service unit the process belongs to, from `/proc/<pid>/cgroup`.
///
/// The unit is the first path component ending in `.service` under the slices, as the system
/// manager sees it: `/system.slice/billing.service` is `billing.service`, and a process of a user
/// session, `/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service`, belongs to
/// `user@1000.service`. Deeper components are not units of the system manager: a delegated subtree
/// (a user's manager, a container runtime) can create cgroups there with any name, so a component
/// below the first service could be forged by whoever owns that subtree. A scope
/// (`session-3.scope`) or the root gives no unit. The cgroup v2 line (`0::`) is read; on a host
/// with only cgroup v1, systemd's named hierarchy (`name=systemd`).
pub(crate) fn cgroup_unit(cgroup: &str) -> Option<&str> {
    let path = cgroup_path(cgroup)?;
    let path = path.strip_prefix('/')?;
    for component in path.split('/') {
        if component.ends_with(".service") {
            return Some(component);
        }
        if !component.ends_with(".slice") {
            return None;
        }
    }
    None
}

fn cgroup_path(cgroup: &str) -> Option<&str> {
    let mut v1 = None;
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            return Some(path);
        }
        if controllers == "name=systemd" && v1.is_none() {
            v1 = Some(path);
        }
    }
    v1
}

/// The value after `key:` on the first line that starts with exactly that key.
fn status_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?;
        rest.strip_prefix(':')
    })
}

/// A decimal number as the kernel prints it: ASCII digits only, no sign.
pub(crate) fn decimal_u32(text: &str) -> Option<u32> {
    u32::try_from(decimal_u64(text)?).ok()
}

fn decimal_u64(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
