use super::*;

struct Fixed;

impl VerdictCounters for Fixed {
    fn read(&self) -> Vec<VerdictCount> {
        let count = |verdict, packets| VerdictCount {
            namespace: "shop".into(),
            policy: "web".into(),
            verdict,
            packets,
            bytes: packets * 60,
        };
        vec![count(Verdict::Accept, 3), count(Verdict::Drop, 2)]
    }
}

fn text(metrics: &Metrics) -> String {
    metrics.answer("/metrics").body
}

#[test]
fn health_follows_the_applies() {
    let metrics = Metrics::default();
    assert_eq!(metrics.answer("/healthz").status, 503, "nothing applied yet");
    assert_eq!(metrics.answer("/readyz").status, 503);
    metrics.transaction(Some(Applied::Replaced(12)), Duration::from_millis(3));
    metrics.in_force(&Plan::default());
    assert_eq!(metrics.answer("/healthz"), Answer::text(200, "ok\n"));
    assert_eq!(metrics.answer("/readyz"), Answer::text(200, "cni-netpol is ready"));
    metrics.transaction(None, Duration::from_millis(1));
    assert_eq!(metrics.answer("/healthz").status, 503, "the kernel refused the latest view");
    assert_eq!(metrics.answer("/readyz").status, 200, "ready once is ready");
    assert_eq!(metrics.answer("/").status, 404);
    let text = text(&metrics);
    for line in [
        "cni_netpol_transactions_total{result=\"replaced\"} 1\n",
        "cni_netpol_transactions_total{result=\"refused\"} 1\n",
        "cni_netpol_transaction_duration_seconds_count 2\n",
        "cni_netpol_transaction_duration_seconds_bucket{le=\"0.005\"} 2\n",
        "cni_netpol_rules 0\n",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
}

#[test]
fn an_event_is_timed_to_the_transaction_that_puts_it_in_force() {
    let metrics = Metrics::default();
    assert_eq!(metrics.take_event(), None);
    metrics.event();
    let first = metrics.take_event();
    metrics.event();
    metrics.event_applied(first, None);
    assert_eq!(metrics.take_event(), first, "refused: the earlier event's time kept");
    metrics.event_applied(first, Some(Applied::Unchanged));
    assert!(text(&metrics).contains("cni_netpol_event_to_kernel_seconds_count 0\n"));
    metrics.event_applied(first, Some(Applied::Elements(2)));
    assert!(text(&metrics).contains("cni_netpol_event_to_kernel_seconds_count 1\n"), "{}", text(&metrics));
}

#[test]
fn restarts_relists_and_verdicts_by_label() {
    let metrics = Metrics::default();
    assert!(!text(&metrics).contains("policy_packets"), "no verdict source, no series");
    metrics.watch_restart("pods", false);
    metrics.watch_restart("pods", true);
    metrics.count_verdicts(Box::new(Fixed));
    let text = text(&metrics);
    for line in [
        "cni_netpol_watch_restarts_total{resource=\"pods\"} 2\n",
        "cni_netpol_relists_total{resource=\"pods\"} 1\n",
        "# TYPE cni_netpol_policy_packets_total counter\n",
        "cni_netpol_policy_packets_total{namespace=\"shop\",policy=\"web\",verdict=\"accept\"} 3\n",
        "cni_netpol_policy_bytes_total{namespace=\"shop\",policy=\"web\",verdict=\"drop\"} 120\n",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
}
