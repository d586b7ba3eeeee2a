"""What a gang is called: unique readable ids, DNS labels and label values from any name."""

from __future__ import annotations

import re

import pytest

from jupyter_mn.gang.base import Gang
from jupyter_mn.gang.local import LocalProvisioner
from jupyter_mn.model import gangids
from jupyter_mn.model.spec import ClusterSpec

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def test_two_gangs_of_one_name_get_different_readable_ids():
    spec = ClusterSpec(name="train")
    first, second = Gang(spec, LocalProvisioner()), Gang(spec, LocalProvisioner())
    assert first.core.id != second.core.id
    assert first.core.id.startswith("train-") and second.core.id.startswith("train-")
    assert first.core.topic != second.core.topic
    assert Gang(ClusterSpec(), LocalProvisioner()).core.id.startswith("jmn-")


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("train", "train-"),
        ("My_Sweep_03", "my-sweep-03-"),
        ("2024 run", "jmn-2024-run-"),
        ("--x--", "x-"),
        ("☃", "jmn-"),
        (None, "jmn-"),
    ],
)
def test_gang_ids_are_dns_labels_that_start_with_the_name(name, prefix):
    made = {gangids.gang_id(name) for _ in range(50)}
    assert len(made) == 50
    for gang in made:
        assert gang.startswith(prefix), gang
        assert DNS_1035.match(gang) and len(gang) <= gangids.MAX_ID, gang


def test_long_names_are_shortened_with_a_hash_of_the_whole_name():
    a, b = "sweep-" + "a" * 80 + "-lr1", "sweep-" + "a" * 80 + "-lr2"
    label_a, label_b = gangids.dns_label(a, 40), gangids.dns_label(b, 40)
    assert len(label_a) == len(label_b) == 40 and label_a != label_b
    assert label_a.startswith("sweep-aaaa") and DNS_1035.match(label_a)
    assert gangids.dns_label(a, 40) == label_a  # stable
    assert len(gangids.gang_id(a)) == gangids.MAX_ID


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("My_Sweep_03", "My_Sweep_03"),
        ("my sweep/03", "my-sweep-03"),
        ("_x_", "x"),
        ("☃", ""),
    ],
)
def test_label_values_keep_what_kubernetes_allows(name, value):
    assert gangids.label_value(name) == value
    long = gangids.label_value("Run." + "x" * 100)
    assert len(long) == 63 and LABEL_VALUE.match(long) and long.startswith("Run.xxx")


def test_display_names_may_be_any_printable_text():
    assert gangids.name_problem("My Sweep #3 (lr=1e-4)") is None
    assert gangids.name_problem(" ") == "is empty"
    assert gangids.name_problem("a\nb") == "contains control characters"
    assert gangids.name_problem("x" * 129) == "is longer than 128 characters"
