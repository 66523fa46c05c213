use proptest::prelude::*;

use super::*;

const STATUS: &str = "Name:\tbilling\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\n\
Pid:\t4242\nPPid:\t1\nTracerPid:\t0\nUid:\t1001\t1002\t1003\t1004\nGid:\t2001\t2002\t2003\t2004\n\
FDSize:\t64\nGroups:\t10 27 2001 \nNStgid:\t4242\n";

#[test]
fn status_ids_are_read_in_the_kernels_order() {
    assert_eq!(status_ids(STATUS, "Uid"), Some([1001, 1002, 1003, 1004]));
    assert_eq!(status_ids(STATUS, "Gid"), Some([2001, 2002, 2003, 2004]));
    assert_eq!(status_groups(STATUS), Some(vec![10, 27, 2001]));
}

#[test]
fn status_lines_must_be_whole() {
    assert_eq!(status_ids("Uid:\t1\t2\t3\n", "Uid"), None);
    assert_eq!(status_ids("Uid:\t1\t2\t3\t4\t5\n", "Uid"), None);
    assert_eq!(status_ids("Uid:\t1\t-2\t3\t4\n", "Uid"), None);
    assert_eq!(status_ids("Uid:\t1\t4294967296\t3\t4\n", "Uid"), None);
    // A key is matched whole: `Uidx:` is not `Uid:`, and only a line's start counts.
    assert_eq!(status_ids("Uidx:\t1\t2\t3\t4\n", "Uid"), None);
    assert_eq!(status_ids("Name:\tUid:\t1\t2\t3\t4\n", "Uid"), None);
    assert_eq!(status_groups("Groups:\t10 x\n"), None);
    assert_eq!(status_groups("Name:\tx\n"), None);
}

#[test]
fn a_process_may_have_no_supplementary_groups() {
    assert_eq!(status_groups("Groups:\t\n"), Some(vec![]));
    assert_eq!(status_groups("Groups:"), Some(vec![]));
}

fn stat_line(comm: &str, state: char, starttime: u64) -> String {
    format!(
        "4242 ({comm}) {state} 1 4242 4242 0 -1 4194560 330 0 0 0 1 2 0 0 20 0 1 0 {starttime} \
         10000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
    )
}

#[test]
fn stat_start_time_is_field_22() {
    let got = stat(&stat_line("billing", 'S', 123_456)).expect("a stat line");
    assert_eq!(
        got,
        Stat {
            state: 'S',
            starttime: 123_456
        }
    );
    assert!(!got.has_exited());
}

#[test]
fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
    let got = stat(&stat_line("a) Z 1 2 (b c)", 'R', 99)).expect("a stat line");
    assert_eq!(
        got,
        Stat {
            state: 'R',
            starttime: 99
        }
    );
}

#[test]
fn zombies_and_dead_processes_have_exited() {
    assert!(stat(&stat_line("x", 'Z', 1))
        .expect("a stat line")
        .has_exited());
    assert!(stat(&stat_line("x", 'X', 1))
        .expect("a stat line")
        .has_exited());
}

#[test]
fn truncated_or_garbled_stat_is_refused() {
    assert_eq!(stat("4242 (billing) S 1 2 3"), None);
    assert_eq!(stat("4242 billing) S 1 2 3"), None);
    assert_eq!(stat(")4242 (x"), None);
    assert_eq!(
        stat(&stat_line("x", 'S', 1).replacen(" 1 10000 ", " 1x 10000 ", 1)),
        None
    );
    assert_eq!(
        stat(&stat_line("x", 'S', 1).replacen(" S ", " Sx ", 1)),
        None
    );
    assert_eq!(stat(""), None);
}

#[test]
fn fdinfo_pid_is_the_pid_line_not_nspid() {
    let fdinfo = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2050\nPid:\t4242\nNSpid:\t4242\n";
    assert_eq!(fdinfo_pid(fdinfo), Some(4242));
    assert_eq!(fdinfo_pid("NSpid:\t7\nPid:\t-1\n"), Some(-1));
    assert_eq!(fdinfo_pid("NSpid:\t7\n"), None);
    assert_eq!(fdinfo_pid("Pid:\t--1\n"), None);
    assert_eq!(fdinfo_pid("Pid:\t+1\n"), None);
}

#[test]
fn a_system_service_is_its_unit() {
    let cgroup = "0::/system.slice/billing.service\n";
    assert_eq!(cgroup_unit(cgroup), Some("billing.service"));
    let templated = "0::/system.slice/system-getty.slice/getty@tty1.service\n";
    assert_eq!(cgroup_unit(templated), Some("getty@tty1.service"));
    let delegated = "0::/system.slice/docker.service/payload\n";
    assert_eq!(cgroup_unit(delegated), Some("docker.service"));
}

#[test]
fn a_user_sessions_service_is_its_users_manager() {
    let cgroup = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service\n";
    assert_eq!(cgroup_unit(cgroup), Some("user@1000.service"));
}

#[test]
fn scopes_and_the_root_have_no_unit() {
    assert_eq!(
        cgroup_unit("0::/user.slice/user-1000.slice/session-3.scope\n"),
        None
    );
    assert_eq!(cgroup_unit("0::/init.scope\n"), None);
    assert_eq!(cgroup_unit("0::/\n"), None);
    assert_eq!(
        cgroup_unit("0::/machine.slice/libpod-1.scope/x.service\n"),
        None
    );
    assert_eq!(cgroup_unit(""), None);
}

#[test]
fn cgroup_v1_hosts_use_the_systemd_hierarchy() {
    let v1 = "12:cpu,cpuacct:/other.service\n1:name=systemd:/system.slice/billing.service\n";
    assert_eq!(cgroup_unit(v1), Some("billing.service"));
    let hybrid = "1:name=systemd:/system.slice/old.service\n0::/system.slice/billing.service\n";
    assert_eq!(cgroup_unit(hybrid), Some("billing.service"));
}

proptest! {
    #[test]
    fn parsers_never_panic(text in any::<String>()) {
        let _ = status_ids(&text, "Uid");
        let _ = status_groups(&text);
        let _ = stat(&text);
        let _ = fdinfo_pid(&text);
        let _ = cgroup_unit(&text);
    }

    #[test]
    fn parsers_never_panic_on_lines_that_look_right(
        key in prop::sample::select(vec!["Uid:", "Gid:", "Groups:", "Pid:", "0::", "1 ("]),
        rest in "[ -~\t\n()]{0,80}",
    ) {
        let text = format!("{key}{rest}");
        let _ = status_ids(&text, "Uid");
        let _ = status_groups(&text);
        let _ = stat(&text);
        let _ = fdinfo_pid(&text);
        let _ = cgroup_unit(&text);
    }

    #[test]
    fn status_round_trips(ids in any::<[u32; 4]>(), groups in prop::collection::vec(any::<u32>(), 0..40)) {
        let listed: Vec<String> = groups.iter().map(u32::to_string).collect();
        let text = format!(
            "Name:\tx\nUid:\t{}\t{}\t{}\t{}\nGroups:\t{} \n",
            ids[0], ids[1], ids[2], ids[3], listed.join(" "),
        );
        prop_assert_eq!(status_ids(&text, "Uid"), Some(ids));
        prop_assert_eq!(status_groups(&text), Some(groups));
    }

    #[test]
    fn stat_round_trips_whatever_the_command_name(
        comm in "[^\u{0}]{0,16}",
        state in prop::sample::select(vec!['R', 'S', 'D', 'Z', 'T', 'X', 'I']),
        starttime in any::<u64>(),
    ) {
        prop_assert_eq!(stat(&stat_line(&comm, state, starttime)), Some(Stat { state, starttime }));
    }

    #[test]
    fn fdinfo_round_trips(pid in -1i64..=i64::from(i32::MAX)) {
        let text = format!("pos:\t0\nflags:\t02000002\nPid:\t{pid}\nNSpid:\t{pid}\n");
        prop_assert_eq!(fdinfo_pid(&text), Some(pid));
    }

    #[test]
    fn a_service_under_slices_round_trips(
        slices in prop::collection::vec("[a-z0-9-]{1,12}\\.slice", 0..4),
        unit in "[a-zA-Z0-9:_.@-]{1,40}\\.service",
        below in prop::collection::vec("[a-z0-9.-]{1,12}", 0..3),
    ) {
        let mut path = slices.clone();
        path.push(unit.clone());
        path.extend(below);
        let text = format!("0::/{}\n", path.join("/"));
        prop_assert_eq!(cgroup_unit(&text), Some(unit.as_str()));
    }
}
