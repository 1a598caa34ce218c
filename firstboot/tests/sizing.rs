//! Sizing against the providers' published numbers, and the real binary writing max pods and
//! reservations into kubelet.env and status.json from a faked `/proc` and `/sys` under `--root`.

// The published-number tables run everywhere, under Wine too; the runs of the real binary
// need a faked /proc and /sys and sh stubs, so they are Unix-only (scripts/wine-not-run.tsv).
#[cfg(unix)]
use crate::common;

use kiln_firstboot::contract::sizing::Formula;
use kiln_firstboot::sizing::{
    aks_cpu_millicores, aks_memory_mib, aws_prefix_delegation, aws_secondary_ips, eks_ceiling,
    eks_memory_mib, gke_memory_mib, lookup, max_pods, parse_table, reserve, tiered_cpu_millicores,
    Reserved,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// kiln's committed AWS table, as baked.
fn table() -> String {
    std::fs::read_to_string(repo().join("images/data/aws-eni.tsv")).unwrap()
}

/// AWS's published `type maxpods` lines (fixtures/sizing/README.md).
fn published() -> BTreeMap<String, u32> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sizing/eni-max-pods.txt"),
    )
    .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (t, n) = l.split_once(' ').unwrap();
            (t.to_string(), n.trim().parse().unwrap())
        })
        .collect()
}

/// Instance types across families and generations (Xen and Nitro, Intel, AMD and Graviton,
/// burstable, GPU, inference, HPC, storage, memory, bare metal, multi-card), each of which must
/// be in both tables with the published value.
const SPOT_CHECKS: [&str; 36] = [
    "t2.micro",
    "t3.small",
    "t3.medium",
    "t3a.large",
    "t4g.nano",
    "m4.large",
    "m5.large",
    "m5.xlarge",
    "m5.24xlarge",
    "m5.metal",
    "m6i.large",
    "m6g.medium",
    "m7i.48xlarge",
    "c4.large",
    "c5.large",
    "c5.4xlarge",
    "c5n.18xlarge",
    "c6gn.16xlarge",
    "c7g.xlarge",
    "r5.large",
    "r6i.32xlarge",
    "x1.16xlarge",
    "x2iedn.32xlarge",
    "z1d.large",
    "i3.large",
    "i3en.24xlarge",
    "d2.xlarge",
    "d3.xlarge",
    "g4dn.xlarge",
    "g5.48xlarge",
    "p4d.24xlarge",
    "p5.48xlarge",
    "inf1.xlarge",
    "inf2.48xlarge",
    "trn1.32xlarge",
    "a1.medium",
];

#[test]
fn the_committed_table_gives_the_published_max_pods() {
    let table = table();
    let rows = parse_table(&table).unwrap();
    let published = published();
    assert!(rows.len() >= 1384, "{} rows", rows.len());
    let mut compared = 0;
    for (ty, limits) in &rows {
        if let Some(want) = published.get(*ty) {
            assert_eq!(aws_secondary_ips(*limits), *want, "{ty}: {limits:?}");
            compared += 1;
        }
    }
    // Every type in both files (the research cross-check found 1,191; 6 retired types are
    // only in the published file, 193 newer ones only in the table).
    assert_eq!(compared, 1191);
    for ty in SPOT_CHECKS {
        let limits = lookup(&table, ty).unwrap_or_else(|| panic!("{ty} not in the table"));
        let want = published[ty];
        assert_eq!(aws_secondary_ips(limits), want, "{ty}");
        // Through the mode, with a CPU count above 30 so that only a value over 250 is capped.
        let got = max_pods(
            kiln_firstboot::contract::sizing::CniMode::AwsVpcCni,
            ty,
            Some(64),
            Some(&table),
            110,
        );
        assert_eq!(got.value, want.min(250), "{ty}: {got:?}");
        assert_eq!(got.warning, None);
    }
}

#[test]
fn published_spot_values_and_the_eks_ceiling() {
    let table = table();
    // eni-max-pods.txt / the issue: t3.small 11, c5.large 29, t2.micro 4, p5.48xlarge 100
    // (default card only), a1.4xlarge 234.
    for (ty, want) in [
        ("t3.small", 11),
        ("c5.large", 29),
        ("t2.micro", 4),
        ("p5.48xlarge", 100),
        ("a1.4xlarge", 234),
    ] {
        assert_eq!(aws_secondary_ips(lookup(&table, ty).unwrap()), want, "{ty}");
    }
    // awslabs/amazon-eks-ami issue #1368: `max-pods-calculator.sh --instance-type c5.4xlarge`
    // prints 110 (16 vCPUs, under the 110 ceiling) where eni-max-pods.txt says 234.
    let c5 = max_pods(
        kiln_firstboot::contract::sizing::CniMode::AwsVpcCni,
        "c5.4xlarge",
        Some(16),
        Some(&table),
        110,
    );
    assert_eq!(c5.value, 110, "{c5:?}");
    assert!(c5.source.ends_with("= 234, capped at 110"), "{c5:?}");
    assert_eq!((eks_ceiling(30), eks_ceiling(31)), (110, 250));
    // Prefix delegation: aws/amazon-vpc-cni-k8s v1.9.0 release notes, "a t3.medium can have 5
    // (/28) prefixes per ENI": 3 ENIs x 5 x 16 + 2.
    let t3 = lookup(&table, "t3.medium").unwrap();
    assert_eq!(aws_prefix_delegation(t3), 3 * 5 * 16 + 2);
    // Xen types get no prefixes (max-pods-calculator.sh: IS_NITRO), bare metal is "unknown".
    for ty in ["m4.large", "m5.metal"] {
        let l = lookup(&table, ty).unwrap();
        assert_eq!(aws_prefix_delegation(l), aws_secondary_ips(l), "{ty}");
    }
}

#[test]
fn eks_memory_matches_nodeadms_expected_configs() {
    // awslabs/amazon-eks-ami nodeadm/test/e2e/cases/*/expected-kubelet-config.json @
    // 81fec2e895854f599974fe4d3d72f61c0a9aaffa: (maxPods, kubeReserved.memory in Mi).
    for (pods, mib) in [(44, 739), (58, 893), (60, 915), (110, 1465)] {
        assert_eq!(eks_memory_mib(pods), mib, "{pods} pods");
    }
    // The CPU tiers as GKE publishes them for a 4-vCPU node: allocatable 3920m of 4000m.
    assert_eq!(tiered_cpu_millicores(4), 80);
}

#[test]
fn gke_memory_matches_the_published_examples() {
    // GKE's tiers: 255 MiB under 1 GiB.
    assert_eq!(gke_memory_mib(768), 255);
    // n1-standard-2, 7.5 GB: "about 1.7 GB" reserved (25 % of 4 GiB + 20 % of 3.5 GiB).
    assert_eq!(gke_memory_mib(7680), 1740);
    // 150 GiB: 9.8577 GiB not allocatable (the calculator's published example), which is
    // kube-reserved 1024 + 819.2 + 819.2 + 0.06 x 112 GiB + 0.02 x 22 GiB = 9994.24 MiB plus the
    // 100 MiB eviction threshold: 10094.24 MiB = 9.8577 GiB.
    assert_eq!(gke_memory_mib(150 * 1024), 9994);
    // kiln rounds down to whole MiB, so the published figure is met to within 1 MiB.
    let gib = (gke_memory_mib(150 * 1024) + 100) as f64 / 1024.0;
    assert!((gib - 9.8577).abs() < 1.0 / 1024.0, "{gib}");
    let r = reserve(Formula::Gke, 4, 16 * 1024, 110, &Reserved::default());
    assert_eq!(r.kube.render('='), "cpu=80m,memory=2662Mi");
    // Over 110 pods GKE reserves 400 mCPU more.
    let r = reserve(Formula::Gke, 4, 16 * 1024, 256, &Reserved::default());
    assert_eq!(r.kube.render('='), "cpu=480m,memory=2662Mi");
}

#[test]
fn aks_matches_the_published_table_and_examples() {
    // learn.microsoft.com/azure/aks/node-resource-reservations: CPU by host cores.
    for (cores, m) in [
        (1, 60),
        (2, 100),
        (4, 140),
        (8, 180),
        (16, 260),
        (32, 420),
        (64, 740),
    ] {
        assert_eq!(aks_cpu_millicores(cores), m, "{cores} cores");
    }
    // Memory (AKS >= 1.29): "8 GB, 30 pods: 20 x 30 + 50 = 650"; "4 GB, 70 pods: 25 % of
    // 4 GB = 1000, less than 1450".
    assert_eq!(aks_memory_mib(30, 8000), 650);
    assert_eq!(aks_memory_mib(70, 4000), 1000);
}

// ---------------------------------------------------------------------------------------------
// The real binary.

#[cfg(unix)]
mod node {
    use super::*;
    use common::*;

    const CONSOLE: &str = "console.log";

    /// A QEMU-provider node of `instance_type` with `cpus` online CPUs and `mem_kib` MemTotal,
    /// the committed AWS table baked, and image.env naming `mode` and `formula`.
    fn sized_node(
        instance_type: &str,
        cpus: &str,
        mem_kib: u64,
        mode: &str,
        formula: &str,
    ) -> Root {
        let root = Root::node("QEMU");
        for (key, v) in [
            ("instance-id", "kiln-qemu-0001"),
            ("local-ipv4", "10.0.2.15"),
            ("instance-type", instance_type),
        ] {
            root.write(
                &format!("sys/firmware/qemu_fw_cfg/by_name/opt/kiln/{key}/raw"),
                &format!("{v}\n"),
            );
        }
        // The baked map would win over the table; this image has none.
        root.write("usr/lib/kiln/max-pods.map", "# instance-type pods\n");
        let image = root.read("usr/lib/kiln/image.env");
        root.write(
            "usr/lib/kiln/image.env",
            &format!("{image}MAX_PODS_MODE={mode}\nRESERVATION={formula}\n"),
        );
        root.write("usr/lib/kiln/aws-eni.tsv", &table());
        if !cpus.is_empty() {
            root.write("sys/devices/system/cpu/online", &format!("{cpus}\n"));
        }
        if mem_kib > 0 {
            root.write(
                "proc/meminfo",
                &format!("MemTotal:       {mem_kib} kB\nMemFree:        1024 kB\n"),
            );
        }
        root
    }

    fn run(root: &Root) -> Outcome {
        let out = firstboot(root, &["--provider", "qemu", "--no-start"]);
        assert_eq!(out.code, 0, "{out:#?}");
        out
    }

    fn sizing_json(root: &Root) -> String {
        let s = root.read("run/kiln/status.json");
        let start = s.find(",\"sizing\":").expect("a sizing object") + ",\"sizing\":".len();
        let end = start + s[start..].find('}').unwrap() + 1;
        s[start..end].to_string()
    }

    #[test]
    fn eks_on_m5_large_with_two_cpus() {
        let root = sized_node("m5.large", "0-1", 7_834_000, "aws-vpc-cni", "eks");
        run(&root);
        let env = root.read("run/kiln/kubelet.env");
        for line in [
            "MAX_PODS=29\n",
            "KUBE_RESERVED=\"cpu=70m,memory=574Mi,ephemeral-storage=1Gi\"\n",
            "EVICTION_HARD=\"memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%\"\n",
        ] {
            assert!(env.contains(line), "missing {line:?} in\n{env}");
        }
        assert!(!env.contains("SYSTEM_RESERVED"), "{env}");
        // kubelet gets them from the node's drop-in, as KubeletConfiguration fields.
        let dropin = root.read("run/kiln/kubelet.conf.d/10-kiln-node.conf");
        assert!(
            dropin.contains(
                "\"maxPods\":29,\"kubeReserved\":{\"cpu\":\"70m\",\"memory\":\"574Mi\",\"ephemeral-storage\":\"1Gi\"},\
                 \"evictionHard\":{\"memory.available\":\"100Mi\",\"nodefs.available\":\"10%\",\
                 \"nodefs.inodesFree\":\"5%\",\"imagefs.available\":\"15%\"}"
            ),
            "{dropin}"
        );
        assert!(
            !env.contains("--max-pods") && !env.contains("--kube-reserved"),
            "{env}"
        );
        assert_eq!(
            sizing_json(&root),
            "{\"max_pods\":29,\"max_pods_source\":\"aws-vpc-cni: 3 ENIs x (10-1) + 2 = 29\",\
             \"cpus\":2,\"mem_total_kib\":7834000,\"reservation\":\"eks\",\
             \"kube_reserved\":\"cpu=70m,memory=574Mi,ephemeral-storage=1Gi\",\"system_reserved\":\"\",\
             \"eviction_hard\":\"memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%\"}"
        );
        assert!(!root.read("run/kiln/status.json").contains("\"warnings\""));
        assert!(root
            .read(CONSOLE)
            .contains("phase=write result=success ms="));
        // Same inputs, same bytes.
        let first = env;
        run(&root);
        assert_eq!(root.read("run/kiln/kubelet.env"), first);
    }

    #[test]
    fn prefix_delegation_is_capped_by_cpu_count() {
        // m5.large: 3 x (9 x 16) + 2 = 434, capped at 110 on 2 vCPUs; memory follows the capped value.
        let root = sized_node(
            "m5.large",
            "0-1",
            7_834_000,
            "aws-vpc-cni-prefix-delegation",
            "eks",
        );
        run(&root);
        let env = root.read("run/kiln/kubelet.env");
        assert!(env.contains("MAX_PODS=110\n"), "{env}");
        assert!(env.contains("memory=1465Mi"), "{env}");
        assert!(sizing_json(&root).contains("\"max_pods_source\":\"aws-vpc-cni-prefix-delegation: 3 ENIs x (10-1) x 16 + 2 = 434, capped at 110\""));
        // m5.24xlarge on 96 CPUs (a cpu list with a hole is counted, not read as a range end).
        let root = sized_node(
            "m5.24xlarge",
            "0-47,48-95",
            393_000_000,
            "aws-vpc-cni-prefix-delegation",
            "eks",
        );
        run(&root);
        let env = root.read("run/kiln/kubelet.env");
        assert!(env.contains("MAX_PODS=250\n"), "{env}");
        assert!(
            env.contains("KUBE_RESERVED=\"cpu=310m,memory=3005Mi,ephemeral-storage=1Gi\"\n"),
            "{env}"
        );
    }

    #[test]
    fn an_unknown_instance_type_is_a_warning_not_a_silent_default() {
        let root = sized_node("x9z.huge", "0-3", 16_000_000, "aws-vpc-cni", "eks");
        run(&root);
        let env = root.read("run/kiln/kubelet.env");
        assert!(env.contains("MAX_PODS=110\n"), "{env}");
        let status = root.read("run/kiln/status.json");
        assert!(
            status.contains("\"warnings\":[\"instance type \\\"x9z.huge\\\" is not in /usr/lib/kiln/aws-eni.tsv: max pods is DEFAULT_MAX_PODS=110"),
            "{status}"
        );
        let console = root.read(CONSOLE);
        assert!(
            console.contains("kiln-firstboot: warning: instance type \"x9z.huge\" is not in"),
            "{console}"
        );
        // A missing table is named too.
        std::fs::remove_file(root.path("usr/lib/kiln/aws-eni.tsv")).unwrap();
        run(&root);
        let status = root.read("run/kiln/status.json");
        assert!(
            status.contains("MAX_PODS_MODE=aws-vpc-cni but /usr/lib/kiln/aws-eni.tsv is missing"),
            "{status}"
        );
    }

    #[test]
    fn node_env_overrides_one_value_each() {
        let root = sized_node("m5.large", "0-1", 7_834_000, "aws-vpc-cni", "eks");
        root.node_env(
            "MAX_PODS=20\nKUBE_RESERVED=memory=1Gi\nSYSTEM_RESERVED=cpu=100m,memory=200Mi\n\
             EVICTION_HARD=\"memory.available<500Mi\"\n",
        );
        run(&root);
        let env = root.read("run/kiln/kubelet.env");
        for line in [
            "MAX_PODS=20\n",
            // cpu from the formula (2 vCPUs), memory from node.env; MAX_PODS=20 would give 475Mi.
            "KUBE_RESERVED=\"cpu=70m,memory=1Gi,ephemeral-storage=1Gi\"\n",
            "SYSTEM_RESERVED=\"cpu=100m,memory=200Mi\"\n",
            "EVICTION_HARD=\"memory.available<500Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%\"\n",
        ] {
            assert!(env.contains(line), "missing {line:?} in\n{env}");
        }
        assert!(sizing_json(&root).contains("\"max_pods_source\":\"MAX_PODS\""));

        root.node_env("KUBE_RESERVED=cpu=lots\n");
        let out = firstboot(&root, &["--provider", "qemu", "--no-start"]);
        assert_eq!(out.code, 3, "{out:#?}");
        assert!(
            out.stderr.contains(
                "node.env: KUBE_RESERVED: expected comma-separated resource=quantity pairs"
            ),
            "{}",
            out.stderr
        );
    }

    #[test]
    fn gke_and_aks_formulas_from_the_machine() {
        // GKE: 4 vCPUs from /proc/cpuinfo (no /sys list), 16 GiB.
        let root = sized_node("n2-standard-4", "", 16 * 1024 * 1024, "gke", "gke");
        root.write(
            "proc/cpuinfo",
            "processor\t: 0\n\nprocessor\t: 1\n\nprocessor\t: 2\n\nprocessor\t: 3\n",
        );
        run(&root);
        let env = root.read("run/kiln/kubelet.env");
        assert!(env.contains("MAX_PODS=110\n"), "{env}");
        assert!(
            env.contains("KUBE_RESERVED=\"cpu=80m,memory=2662Mi\"\n"),
            "{env}"
        );
        // AKS with Azure CNI: 30 pods, 8 cores, 32 GiB: 180m, 20 x 30 + 50 = 650Mi.
        let root = sized_node(
            "Standard_D8s_v5",
            "0-7",
            32 * 1024 * 1024,
            "azure-cni",
            "aks",
        );
        run(&root);
        let env = root.read("run/kiln/kubelet.env");
        assert!(env.contains("MAX_PODS=30\n"), "{env}");
        assert!(
            env.contains("KUBE_RESERVED=\"cpu=180m,memory=650Mi\"\n"),
            "{env}"
        );
    }

    #[test]
    fn without_proc_the_reservation_is_a_warning() {
        let root = sized_node("m5.large", "", 0, "aws-vpc-cni", "eks");
        run(&root);
        let env = root.read("run/kiln/kubelet.env");
        assert!(
            !env.contains("KUBE_RESERVED") && !env.contains("--kube-reserved"),
            "{env}"
        );
        let dropin = root.read("run/kiln/kubelet.conf.d/10-kiln-node.conf");
        assert!(!dropin.contains("kubeReserved"), "{dropin}");
        // Without a CPU count the low ceiling applies (29 is below it anyway).
        assert!(env.contains("MAX_PODS=29\n"), "{env}");
        let status = root.read("run/kiln/status.json");
        assert!(status.contains("cannot count CPUs"), "{status}");
        assert!(
            status.contains("RESERVATION=eks needs the CPU count and MemTotal"),
            "{status}"
        );
    }

    #[test]
    fn an_image_without_sizing_keys_keeps_the_old_behaviour() {
        // Root::node's image.env names no mode: max-pods.map, else DEFAULT_MAX_PODS, no flags.
        let root = Root::node("QEMU");
        for (key, v) in [
            ("instance-id", "kiln-qemu-0001"),
            ("local-ipv4", "10.0.2.15"),
            ("instance-type", "t3.small"),
        ] {
            root.write(
                &format!("sys/firmware/qemu_fw_cfg/by_name/opt/kiln/{key}/raw"),
                v,
            );
        }
        root.write("sys/devices/system/cpu/online", "0-1\n");
        run(&root);
        let env = root.read("run/kiln/kubelet.env");
        assert!(env.contains("MAX_PODS=110\n"), "{env}");
        assert!(
            !env.contains("RESERVED") && !env.contains("EVICTION"),
            "{env}"
        );
        assert!(!root.read("run/kiln/status.json").contains("\"warnings\""));
    }
}
