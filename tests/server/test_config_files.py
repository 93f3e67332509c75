"""The one config file format (TOML, docs/deploy.md): [node] and [gateway] tables, validated
with errors that name the file, the table and the field; the shipped examples load."""

from __future__ import annotations

from pathlib import Path

import pytest
from spate.core.errors import InvalidArgument
from spate.server.gateway_process import load_gateway_settings
from spate.server.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
SECRET = {"metadata_password": "from-the-environment"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spate.toml"
    path.write_text(text)
    return path


def test_one_file_holds_a_node_and_a_gateway(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[node]
node_id = "n1"
data_dir = "/var/lib/spate/n1"
host = "0.0.0.0"
advertise_host = "10.0.0.1"
metadata_peers = ["10.0.0.2:7700", "10.0.0.3:7700"]
metrics_port = 7900
log_format = "json"

[gateway]
admin = ["10.0.0.1:7600", "10.0.0.2:7600"]
data_dir = "/var/lib/spate/g1"
host = "10.0.0.1"
metrics_port = 7901

[gateway.rooms]
max_rooms = 10
""",
    )
    node = load_settings(path, SECRET)
    assert node.metadata_peers == ("10.0.0.2:7700", "10.0.0.3:7700")
    assert node.data_dir == Path("/var/lib/spate/n1") and node.log_format == "json"
    gateway = load_gateway_settings(path, {"secret": "s"})
    assert gateway.admin == ("10.0.0.1:7600", "10.0.0.2:7600")
    assert gateway.rooms.max_rooms == 10 and gateway.metrics_port == 7901
    # the command line wins over the file
    assert load_settings(path, {**SECRET, "metrics_port": 0}).metrics_port == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[node]\nnode_id = "n1"\ndata_dir = "d"\namqp_port = "5672"\n',
            "amqp_port must be an integer",
        ),
        (
            '[node]\nnode_id = "n1"\ndata_dir = "d"\namqp_port = 70000\n',
            "amqp_port must be 0-65535",
        ),
        (
            '[node]\nnode_id = "n1"\ndata_dir = "d"\nallow_anonymous = "no"\n',
            "allow_anonymous must be true or false",
        ),
        (
            '[node]\nnode_id = "n1"\ndata_dir = "d"\nmetadata_peers = [1, 2]\n',
            "metadata_peers must be a list of strings",
        ),
        ('[node]\nnode_id = "n1"\ndata_dir = "d"\namqp_prot = 1\n', "unknown setting(s) amqp_prot"),
        (
            '[node]\nnode_id = "n1"\ndata_dir = "d"\nlog_format = "xml"\n',
            "log_format must be one of",
        ),
        ('[node]\nnode_id = "n1"\n', "needs --node-id and --data-dir"),
        ('[gateway]\nadmin = ["a:1"]\n', "no [node] table"),
        ("[node\n", "cannot read config file"),
    ],
)
def test_node_errors_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        load_settings(write(tmp_path, text), SECRET)
    assert message in error.value.message
    if ("must be" in message and "one of" not in message) or "unknown" in message:
        assert f"config file {tmp_path / 'spate.toml'} [node]" in error.value.message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[gateway]\nadmin = ["a:1"]\ndata_dir = "d"\nport = true\n', "port must be an integer"),
        ('[gateway]\nadmin = ["a:1"]\ndata_dir = "d"\nmode = "tunnel"\n', "--mode must be one of"),
        ('[gateway]\ndata_dir = "d"\n', "a gateway needs admin"),
        (
            '[gateway]\nadmin = ["a:1"]\ndata_dir = "d"\n[gateway.rooms]\nmax_romos = 1\n',
            "unknown setting(s) max_romos",
        ),
    ],
)
def test_gateway_errors_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        load_gateway_settings(write(tmp_path, text), {"secret": "s"})
    assert message in error.value.message


@pytest.mark.parametrize("name", ["n1", "n2", "n3"])
def test_the_shipped_three_host_configs_load(name: str) -> None:
    path = ROOT / "deploy" / "config" / f"{name}.toml"
    node = load_settings(path, SECRET)
    assert node.node_id == name and len(node.metadata_peers) == 2
    if name == "n1":
        gateway = load_gateway_settings(path, {"secret": "s"})
        assert len(gateway.admin) == 3


def test_every_field_is_documented_in_deploy_md() -> None:
    from dataclasses import fields

    from spate.gateway.rooms import RoomsConfig
    from spate.server.gateway_process import GatewaySettings
    from spate.server.settings import NodeSettings

    text = (ROOT / "docs" / "deploy.md").read_text()
    for cls, heading in (
        (NodeSettings, "### `[node]`"),
        (GatewaySettings, "### `[gateway]`"),
        (RoomsConfig, "### `[gateway.rooms]`"),
    ):
        section = text.split(heading, 1)[1].split("\n### ", 1)[0]
        missing = [
            f.name for f in fields(cls) if f.name != "rooms" and f"`{f.name}`" not in section
        ]
        assert not missing, f"docs/deploy.md {heading} does not document {missing}"
