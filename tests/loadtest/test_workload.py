"""The workload file of sessionloop bench: the shipped ones load, every bound and cross-field
rule refuses with the key that is wrong, --set changes one key."""

from __future__ import annotations

import pytest

from sessionloop.cli.loadtest.workload import WorkloadError, load, parse, parse_set, shipped

BASE = """
name = "t"
[[messages]]
text = "hi {n}"
[[phases]]
name = "steady"
seconds = 2
users = 3
"""


def test_the_four_shipped_workloads_load_with_their_loop_kind():
    assert shipped() == ["approvals", "bots-steady", "burst", "long-sessions"]
    kinds = {name: load(name)[0].open_loop for name in shipped()}
    assert kinds == {"approvals": False, "bots-steady": False, "burst": True, "long-sessions": False}
    approvals, text = load("approvals")
    assert approvals.needs_owner and approvals.sessions.permission_mode == "ask"
    assert 'approval = "approve"' in text  # the text itself is kept for the results file


def test_a_minimal_workload_gets_the_documented_defaults():
    w = parse("t", BASE)
    assert (w.sessions.turns, w.sessions.container, w.sessions.permission_mode) == (10, "bench", "acceptCalls")
    assert w.seconds == 2 and not w.open_loop and not w.needs_owner


@pytest.mark.parametrize(("extra", "named"), [
    ("[sessions]\nturns = 0\n", "sessions.turns"),
    ("[sessions]\nwatched = 1.5\n", "sessions.watched"),
    ("[sessions]\nbogus = 1\n", "bogus"),
    ("[client]\nconnections = 0\n", "client.connections"),
    ("[mock]\njitter = \"gaussian\"\n", "mock.jitter"),
])
def test_a_value_out_of_its_bound_is_refused_naming_its_key(extra, named):
    with pytest.raises(WorkloadError, match=named.replace(".", r"\.")):
        parse("t", BASE + extra)


def test_cross_field_rules_are_refused_with_the_phase_or_message_named():
    with pytest.raises(WorkloadError, match=r"phases\[1\] \(two\) mixes an open loop"):
        parse("t", BASE + '[[phases]]\nname = "two"\nseconds = 1\nrate = 5\n')
    with pytest.raises(WorkloadError, match=r"phases\[1\] \(x\) needs users .* or rate"):
        parse("t", BASE + '[[phases]]\nname = "x"\nseconds = 1\n')
    with pytest.raises(WorkloadError, match="same name twice"):
        parse("t", BASE + '[[phases]]\nname = "steady"\nseconds = 1\nusers = 1\n')
    with pytest.raises(WorkloadError, match=r"messages\[1\] waits for an approval.*permission_mode"):
        parse("t", BASE + '[[messages]]\ntext = "!tool write_file {}"\napproval = "approve"\n')


def test_set_changes_one_key_as_toml_or_as_text():
    w = parse("t", BASE, ["sessions.turns=5", "phases.0.seconds=7.5", "sessions.permission_mode=ask",
                          "messages.0.text=plain words"])
    assert (w.sessions.turns, w.phases[0].seconds, w.sessions.permission_mode) == (5, 7.5, "ask")
    assert w.messages[0].text == "plain words"
    with pytest.raises(WorkloadError, match=r"phases\.3 is not an index of a list of 1"):
        parse("t", BASE, ["phases.3.seconds=1"])
    with pytest.raises(WorkloadError, match="expected KEY=VALUE"):
        parse_set("sessions.turns")
    with pytest.raises(WorkloadError, match=r"sessions\.turns"):
        parse("t", BASE, ["sessions.turns=-1"])


def test_a_file_that_is_not_there_or_not_toml_is_refused(tmp_path):
    with pytest.raises(WorkloadError, match="no such file, and not a shipped workload"):
        load(str(tmp_path / "none.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(WorkloadError, match="bad.toml: not TOML"):
        load(str(bad))
    big = tmp_path / "big.toml"
    big.write_text("#" * 1_000_001)
    with pytest.raises(WorkloadError, match="larger than 1,000,000 bytes"):
        load(str(big))
