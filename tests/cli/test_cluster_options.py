"""``serve --cluster``'s options (cli/cluster.py): what is refused before anything starts, and what no log may show."""

from __future__ import annotations

from click.testing import CliRunner

from sessionloop.cli.cluster import url_secret
from sessionloop.cli.main import main as cli


def test_a_cluster_node_is_one_process_not_several_workers(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["serve", "--data", str(tmp_path / "d"), "--cluster", "nats://127.0.0.1:1",
                                      "--workers", "2"])
    assert result.exit_code == 2
    assert "--cluster runs one process per node: use it without --workers" in result.output
    assert not (tmp_path / "d").exists()


def test_a_node_id_without_a_cluster_is_refused(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["serve", "--data", str(tmp_path / "d"), "--node-id", "n1"])
    assert result.exit_code == 2
    assert "--node-id" in result.output and "only for a cluster node" in result.output


def test_a_node_id_with_a_space_is_refused(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["serve", "--data", str(tmp_path / "d"), "--cluster", "nats://127.0.0.1:1",
                                      "--node-id", "my node"])
    assert result.exit_code == 2
    assert "'my node' is not 1 to 64 printable characters without spaces" in result.output


def test_the_token_or_password_of_a_nats_url_is_what_logs_must_hide() -> None:
    assert url_secret("nats://s3cret@10.0.0.1:4222") == "s3cret"
    assert url_secret("nats://user:pa55@10.0.0.1:4222") == "pa55"
    assert url_secret("nats://10.0.0.1:4222") is None
