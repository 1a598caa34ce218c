//! AWS Auto Scaling warm pools (docs/contract.md, "Warm pools"): while IMDS's
//! `autoscaling/target-lifecycle-state` is `Warmed:*`, kiln-firstboot prepares the node and
//! holds kubelet back, asking again until the state leaves the pool; outside a group (404) or
//! `InService`, it joins at once. Played by the IMDSv2 stand-in over loopback.

#![cfg(unix)]

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use kiln_firstboot::standin::aws_imdsv2;

/// IMDSv2 from the AWS fixtures, with the lifecycle state `state` holds (`None`: 404).
fn imds(state: Arc<Mutex<Option<String>>>) -> Server {
    let base = fixtures().join("aws");
    let token = std::fs::read_to_string(base.join("latest/api/token")).unwrap();
    Server::start(aws_imdsv2(token, move |r| {
        if r.route() == "/latest/meta-data/autoscaling/target-lifecycle-state" {
            return match state.lock().unwrap().clone() {
                Some(s) => ok(&s),
                None => status(404),
            };
        }
        fixture_reply(&base, &[], r)
    }))
}

fn node() -> Root {
    let root = Root::node("");
    root.node_env("PROVIDER=aws\n");
    root
}

fn run(root: &Root, url: &str) -> Outcome {
    run_within(root, url, "20")
}

fn run_within(root: &Root, url: &str, deadline: &str) -> Outcome {
    let systemctl = root.stub("systemctl", "exit 0");
    let args = [
        "--metadata-url",
        url,
        "--systemctl",
        &systemctl,
        "--deadline",
        deadline,
    ];
    firstboot(root, &args)
}

fn kubelet_started(root: &Root) -> bool {
    root.calls("systemctl")
        .iter()
        .any(|c| c == "start --no-block kubelet.service")
}

#[test]
fn outside_a_pool_or_in_service_the_node_joins_at_once() {
    for state in [None, Some("InService")] {
        let root = node();
        let srv = imds(Arc::new(Mutex::new(state.map(String::from))));
        let out = run(&root, &srv.url);
        assert_eq!(out.code, 0, "{state:?}: {out:#?}");
        assert!(kubelet_started(&root), "{state:?}");
        assert!(!root.read("run/kiln/status.json").contains("warm pool"));
        // The state is asked for with an IMDSv2 token, as every other key.
        assert!(srv.requests().iter().any(|r| r.route()
            == "/latest/meta-data/autoscaling/target-lifecycle-state"
            && r.header("x-aws-ec2-metadata-token").is_some()));
    }
}

/// A `Warmed:Running` instance: prepared, kubelet held, then joined once the state changes,
/// with a fresh deadline (the run's 5 s one is spent waiting in the pool).
#[test]
fn a_warmed_node_is_prepared_and_joins_only_once_in_service() {
    let root = node();
    root.write("usr/lib/systemd/system/kiln-images.service", "[Service]\n");
    let state = Arc::new(Mutex::new(Some("Warmed:Running".to_string())));
    let srv = imds(state.clone());
    // Whatever the assertions below find, the pool ends, so the run (and this scope) ends.
    struct Release(Arc<Mutex<Option<String>>>);
    impl Drop for Release {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some("InService".into());
        }
    }
    std::thread::scope(|s| {
        let release = Release(state.clone());
        let run = s.spawn(|| run_within(&root, &srv.url, "5"));
        let until = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(root.path("run/kiln/status.json"))
            .is_ok_and(|t| t.contains("kubelet held until the instance is in service"))
        {
            assert!(Instant::now() < until, "no warm pool report");
            std::thread::sleep(Duration::from_millis(100));
        }
        // Prepared: kubelet's environment written, the images imported; kubelet not started.
        assert!(root.exists("run/kiln/kubelet.env"));
        assert!(!kubelet_started(&root), "{:?}", root.calls("systemctl"));
        assert!(root
            .calls("systemctl")
            .contains(&"start kiln-images.service".to_string()));
        let status = root.read("run/kiln/status.json");
        assert!(status.contains("\"result\":\"running\""), "{status}");
        assert!(status.contains("Warmed:Running"), "{status}");
        // Past the run's own 5 s deadline in the pool, then in service.
        std::thread::sleep(Duration::from_secs(6));
        drop(release);
        let out = run.join().unwrap();
        assert_eq!(out.code, 0, "{out:#?}");
    });
    assert!(kubelet_started(&root));
    let status = root.read("run/kiln/status.json");
    assert!(
        status.contains("target lifecycle state InService after"),
        "{status}"
    );
    // Two tokens in all, however many questions: the metadata's and the warm pool's, which
    // lives 6 h and is kept for the wait.
    let reqs = srv.requests();
    let asked = reqs
        .iter()
        .filter(|r| r.route().ends_with("target-lifecycle-state"))
        .count();
    let tokens: Vec<_> = reqs.iter().filter(|r| r.method == "PUT").collect();
    assert!(asked >= 3, "{asked} questions");
    assert_eq!(tokens.len(), 2);
    assert_eq!(
        tokens[1].header("x-aws-ec2-metadata-token-ttl-seconds"),
        Some("21600")
    );
}

/// A state IMDS cannot give (a 500) is a warning, and the node joins.
#[test]
fn an_unreadable_state_is_a_warning_and_the_node_joins() {
    let root = node();
    let base = fixtures().join("aws");
    let token = std::fs::read_to_string(base.join("latest/api/token")).unwrap();
    let srv = Server::start(aws_imdsv2(token, move |r| {
        if r.route().ends_with("target-lifecycle-state") {
            return status(500);
        }
        fixture_reply(&base, &[], r)
    }));
    let out = run(&root, &srv.url);
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(kubelet_started(&root));
    let status = root.read("run/kiln/status.json");
    assert!(
        status.contains("warm pool: target lifecycle state not read")
            && status.contains("HTTP 500"),
        "{status}"
    );
}
