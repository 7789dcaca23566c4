"""The emulated two-cluster link's addresses come from a subnet the user can choose (issue 30 item 7: it
was a hard-coded 10.x.y.0/24 from the pid, which may clash with a network of the host). Checked against
Python's ipaddress, without creating namespaces (that needs root; test_heteropp_two_clusters does)."""
from __future__ import annotations

import ipaddress

import pytest

from bench.heteropp_netns import SUBNET_ENV, end_addresses
from bench.heteropp_two_clusters import main


@pytest.mark.parametrize("subnet", ["192.168.77.0/24", "172.20.0.8/30", "10.9.0.0/16"])
def test_the_ends_are_the_subnets_first_two_hosts(subnet):
    net = ipaddress.IPv4Network(subnet)
    hosts = list(net.hosts())
    assert end_addresses(subnet) == (str(hosts[0]), str(hosts[1]), net.prefixlen)


def test_the_environment_chooses_when_no_subnet_is_given(monkeypatch):
    monkeypatch.setenv(SUBNET_ENV, "192.168.5.0/29")
    assert end_addresses() == ("192.168.5.1", "192.168.5.2", 29)


@pytest.mark.parametrize("subnet, says", [("10.1.2.0/31", "fewer than two host"), ("300.1.2.0/24", "not an IPv4"),
                                          ("fe80::/64", "not an IPv4"), ("lan", "not an IPv4")])
def test_a_bad_subnet_is_named(subnet, says):
    with pytest.raises(ValueError, match=says):
        end_addresses(subnet)


def test_the_bench_rejects_a_bad_subnet_before_any_work(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--subnet", "10.1.2.0/31"])
    assert e.value.code == 2
    assert "--subnet" in capsys.readouterr().err
