"""The parsers scripts/kubelet-e2e judges kubelet by: CRI log records, Prometheus text, kubelet's quantities; and
that the script skips at once without a kubelet."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "scripts", "kubelet"))
import kube_e2e as e2e  # noqa: E402


def test_cri_log_partial_records_are_joined():
    data = ("2026-12-02T00:00:00.000000001Z stdout P seq 1 ab\n"
            "2026-12-02T00:00:00.000000002Z stdout F cd\n"
            "2026-12-02T00:00:00.000000003Z stderr F \n"
            "2026-12-02T00:00:00.000000004Z stdout F seq 2 with  two spaces\n")
    assert e2e.parse_cri_log(data) == ["seq 1 abcd", "", "seq 2 with  two spaces"]


def test_metric_values_match_labels_and_ignore_timestamps():
    text = ('# HELP x\n'
            'container_cpu_usage_seconds_total{container="c",cpu="total",pod="p"} 1.5 1796172230956\n'
            'container_cpu_usage_seconds_total{container="d",pod="p"} 2\n'
            'container_cpu_usage_seconds_total_other{container="c",pod="p"} 9\n'
            'node_cpu_usage_seconds_total 3268.8 1796172222113\n')
    assert e2e.metric_values(text, "container_cpu_usage_seconds_total", container="c", pod="p") == [1.5]
    assert e2e.metric_sum(text, "container_cpu_usage_seconds_total", pod="p") == 3.5
    assert e2e.metric_values(text, "node_cpu_usage_seconds_total") == [3268.8]
    assert e2e.metric_values(text, "container_cpu_usage_seconds_total", container="x") == []


@pytest.mark.parametrize("q,want", [("80131480Ki", 80131480 << 10), ("78226Mi", 78226 << 20), ("123", 123),
                                    ("2G", 2 * 10**9)])
def test_quantity(q, want):
    assert e2e.quantity(q) == want


def test_quantity_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="quantity"):
        e2e.quantity("1.5Gi")


def test_skips_without_a_kubelet():
    env = {k: v for k, v in os.environ.items() if k != "KUBELET"}
    r = subprocess.run([os.path.join(TOP, "scripts", "kubelet-e2e")], env=env, capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0 and "skipped" in r.stdout


def test_manifests_are_static_pods_with_unique_names():
    pods = e2e.manifests("/tmp/unused")
    names = [p["metadata"]["name"] for p in pods]
    assert len(set(names)) == len(names) and set(e2e.STABLE) <= set(names)
    assert all(p["kind"] == "Pod" and p["apiVersion"] == "v1" for p in pods)
