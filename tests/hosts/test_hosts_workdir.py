"""The notebook's own files on nodes that do not see them (docs/architecture.md, "The
notebook's directory on the nodes").

Test hosts (``hosts.py``) with a dask worker each, started in a directory of their own; host 2's
mount namespace hides the notebook's directory under a tmpfs, as a pod or a machine without the
notebook's filesystem; host 1 sees it (a shared filesystem). Each worker has a file cache of
its own, so what a node was sent can be counted there.
"""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_mn import Cluster
from jupyter_mn.errors import FilesNotSent, SpecError
from jupyter_mn.gang.lifecycle import GangStatus
from jupyter_mn.gang.script import run_script
from jupyter_mn.model.kubespec import KubeOptions
from jupyter_mn.model.spec import ClusterSpec
from tests.support.daskcli import DaskCLI, tls_env
from tests.support.kernels import Kernel
from tests.support.kube.cluster import FakeCluster

pytestmark = pytest.mark.system

HOSTS = 2
MODEL = "VERSION = {v}\n\nclass Net:\n    def version(self):\n        return VERSION{pad}\n"
CELL = """import os, yaml
from model import Net
from data import loader
config = yaml.safe_load(open("config.yaml"))
(Net().version(), sum(loader()), config["lr"], os.getcwd(),
 sorted(p for p in os.listdir(".") if p != "__pycache__"))
"""


@pytest.fixture(scope="module")
def notebook(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two modules, a YAML file, a log .gitignore leaves out and a 200 MiB file (sparse)."""
    folder = tmp_path_factory.mktemp("notebook")
    (folder / "model.py").write_text(MODEL.format(v=1, pad=""))
    (folder / "data.py").write_text("def loader():\n    return [1, 2, 3]\n")
    (folder / "config.yaml").write_text("lr: 0.5\n")
    (folder / ".gitignore").write_text("*.log\n")
    (folder / "train.log").write_text("not for the nodes\n")
    with open(folder / "weights.bin", "wb") as f:
        f.truncate(200 << 20)
    return folder


@pytest.fixture(scope="module")
def cli(host_net, notebook, tmp_path_factory) -> Iterator[DaskCLI]:
    hidden = {host_net.hosts[1].hostname: [str(notebook)]}
    with DaskCLI.on_hosts(tmp_path_factory.mktemp("dask-files"), host_net, hidden) as cli:
        yield cli


def _cached(cli: DaskCLI, hostname: str) -> int:
    """Bytes in a node's file cache (its own folder in ``JUPYTER_MN_FILE_CACHE``)."""
    folder = cli.folder / f"files-{hostname}"
    return sum(p.stat().st_size for p in folder.glob("*/*")) if folder.exists() else 0


def _sent(stdout: str) -> int:
    """The bytes a cell's note says were sent (``… 1.2 KiB sent``)."""
    found = re.search(r"which do not see it: ([\d.]+) (B|KiB|MiB) sent", stdout)
    assert found, stdout
    return round(float(found.group(1)) * {"B": 1, "KiB": 1024, "MiB": 1 << 20}[found.group(2)])


def test_a_kernels_cell_imports_its_neighbours_on_a_node_that_does_not_see_them(
    cli, host_net, notebook, no_leftovers
):
    seeing, blind = (h.hostname for h in host_net.hosts)
    kernel = Kernel(env=tls_env(cli.certs), cwd=notebook)
    try:
        flags = f"--backend dask --scheduler {cli.address} --nodes 2 --gpus 1 --no-preflight"
        first = kernel.run(f"%%cluster {flags} --all\n{CELL}")
        assert first.status == "ok", first.error_text
        rows = ast.literal_eval(first.result)
        assert [r[:3] for r in rows] == [(1, 6, 0.5), (1, 6, 0.5)]
        assert rows[0][3] == str(notebook)  # node 0 sees the directory: its ranks run there
        assert rows[1][3] != str(notebook)  # node 1 runs in the gang's copy of it
        assert rows[1][4] == [".gitignore", "config.yaml", "data.py", "model.py"]
        assert f"files: {notebook} (4 files) → node(s) 1, which do not see it" in first.stdout
        assert "weights.bin (200.0 MiB)" in first.stdout  # stays behind, and the cell says so
        sent = _sent(first.stdout)
        assert sent == _cached(cli, blind) == sum((notebook / p).stat().st_size for p in rows[1][4])
        assert _cached(cli, seeing) == 0  # the node that sees the directory was sent nothing

        (notebook / "model.py").write_text(MODEL.format(v=2, pad=" * 10"))
        edited = kernel.run("%%cluster --all\nfrom model import Net\nNet().version()")
        assert edited.result == "[20, 20]", edited.error_text
        assert "reloaded model: changed since the last cell" in edited.stdout
        assert "files: model.py → node(s) 1" in edited.stdout
        assert _sent(edited.stdout) == (notebook / "model.py").stat().st_size

        assert kernel.run("%cluster down").status == "ok"
        assert not Path(rows[1][3]).exists()  # the copy went with its gang
        cached = _cached(cli, blind)
        second = kernel.run(f"%%cluster {flags} --all\n{CELL}")  # a new gang: all is cached
        assert [r[0] for r in ast.literal_eval(second.result)] == [20, 20], second.error_text
        assert _sent(second.stdout) == 0 and _cached(cli, blind) == cached
    finally:
        kernel.shutdown()


def test_a_script_and_a_module_find_their_neighbours_on_a_node_that_does_not_see_them(
    cli, notebook, monkeypatch, no_leftovers
):
    script = notebook / "train.py"
    script.write_text(f"{CELL}\nassert Net().version() > 0 and os.path.exists('train.py')\n")
    monkeypatch.chdir(notebook)
    try:
        with (
            Cluster(backend="dask", scheduler=cli.address, nodes=2, gpus=1, preflight=False) as c,
            c.nodes() as gang,
        ):
            result = run_script(gang, "train.py", [], on_event=None)
            assert result.ok and result.value == 0, result.root_cause
            assert gang.files.copies == [1]
            assert not any("was sent to node" in note for note in result.notes)  # not alone
            module = run_script(gang, "train", [], on_event=None, module=True)
            assert module.ok and module.value == 0, module.root_cause
    finally:
        script.unlink()


def test_a_copy_that_cannot_be_updated_tears_the_gang_down_and_the_next_cell_starts_afresh(
    cli, host_net, notebook, no_leftovers
):
    cache = cli.folder / f"files-{host_net.hosts[1].hostname}"
    added = notebook / "extra.py"
    options = {"backend": "dask", "scheduler": cli.address, "nodes": 2, "gpus": 1}
    with Cluster(**options, preflight=False, workdir=str(notebook)) as cluster:
        assert cluster.run("import model").ok
        gang = cluster.gang
        shutil.rmtree(cache)
        cache.write_text("")  # node 1's cache is no directory any more: it cannot take files
        added.write_text("X = 1\n")
        try:
            with pytest.raises(FilesNotSent, match=r"^node 1: its copy of .+ was not updated"):
                cluster.run("1")
            assert gang.core.status in (GangStatus.BROKEN, GangStatus.CLOSED)
        finally:
            cache.unlink()
            added.unlink()
        assert cluster.run("import model").ok and cluster.gang is not gang  # a fresh gang


def test_pods_that_do_not_see_the_notebook_get_its_directory(
    host_net, notebook, tmp_path_factory, monkeypatch, no_leftovers
):
    folder = tmp_path_factory.mktemp("kube-files")
    machines = {f"machine-{i}": 1 for i in range(2)}
    with FakeCluster(
        folder, nodes=machines, processes=True, net=host_net, hidden=[str(notebook)]
    ) as fake:
        monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        options = KubeOptions(image="registry.example/jupyter-mn-agent:1")
        spec = ClusterSpec(
            nodes=2,
            gpus=1,
            backend="kubernetes",
            kubernetes=options,
            workdir=str(notebook),
            preflight=False,
        )
        with Cluster(spec) as cluster:
            result = cluster.run(CELL, return_all=True)
            rows = result.unwrap()
            assert cluster.gang.files.copies == [0, 1]
            moved = cluster.gang.files.moved
    assert [r[1:3] for r in rows] == [(6, 0.5), (6, 0.5)]
    assert all(r[3] != str(notebook) for r in rows)  # each pod runs in its copy
    assert moved[0] == moved[1] == sum((notebook / p).stat().st_size for p in rows[0][4])


#: What a rank finds in its working directory: each file's path, and whether any holds a planted
#: credential.
LISTED = """import os
found = sorted(os.path.relpath(os.path.join(d, f)) for d, _, fs in os.walk(".") for f in fs)
(os.getcwd(), [p for p in found if "__pycache__" not in p],
 [p for p in found if "planted" in open(p, errors="replace").read()])
"""


def test_credentials_and_a_link_outside_reach_neither_the_node_nor_its_cache(
    cli, host_net, notebook, tmp_path, no_leftovers
):
    planted = {
        ".ssh/id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\nplanted-ssh\n",
        ".aws/credentials": "[default]\naws_secret_access_key = planted-aws\n",
        ".env": "DB_PASSWORD=planted-env\n",
    }
    outside = tmp_path / "credentials"
    outside.write_text("[default]\naws_secret_access_key = planted-outside\n")
    for path, text in planted.items():
        (notebook / path).parent.mkdir(exist_ok=True)
        (notebook / path).write_text(text)
    (notebook / "creds").symlink_to(outside)  # `ln -s ~/.aws/credentials creds`
    options = {"backend": "dask", "scheduler": cli.address, "nodes": 2, "gpus": 1}
    try:
        with Cluster(**options, preflight=False, workdir=str(notebook)) as cluster:
            result = cluster.run(LISTED, return_all=True)
            assert cluster.gang.files.copies == [1]
        copy = result.unwrap()[1]
        assert copy[0] != str(notebook)  # node 1 runs in its copy
        assert copy[1] == [".gitignore", "config.yaml", "data.py", "model.py"]
        assert copy[2] == []
        assert "files left behind: creds (a link to a file outside the directory)" in " ".join(
            result.notes
        )
        cache = cli.folder / f"files-{host_net.hosts[1].hostname}"
        cached = [p for p in cache.rglob("*") if p.is_file()]
        assert cached and not [p for p in cached if "planted" in p.read_text(errors="replace")]
    finally:
        (notebook / "creds").unlink()
        for folder in (".ssh", ".aws"):
            shutil.rmtree(notebook / folder)
        (notebook / ".env").unlink()


def test_over_the_limit_or_bad_input_fails_before_anything_starts(cli, notebook, no_leftovers):
    on = {"backend": "dask", "scheduler": cli.address}
    cached = {name: _cached(cli, name) for name in cli.workers}
    with Cluster(**on, workdir=str(notebook), workdir_limit="64B") as cluster:
        with pytest.raises(SpecError, match=r"over --workdir-limit 64 B. The largest:") as over:
            cluster.run("1")
        assert re.search(r"\n +\d+ B +model\.py\n", str(over.value))
        assert cluster.gang is None
    with (
        Cluster(**on, workdir=str(notebook / "gone")) as cluster,
        pytest.raises(SpecError, match="gone: no such directory"),
    ):
        cluster.run("1")
    with pytest.raises(SpecError, match="workdir_limit 'lots' is not a size"):
        Cluster(**on, workdir_limit="lots")
    assert all(not keys for keys in cli.actors().values())  # no agent was placed anywhere
    assert {name: _cached(cli, name) for name in cli.workers} == cached  # none was sent a byte
