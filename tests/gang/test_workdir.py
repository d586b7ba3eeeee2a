"""What of the notebook's directory travels, how a node keeps its copy, and how ranks reload
edited modules: the pure parts, on real files (the nodes themselves: ``test_hosts_workdir.py``)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from jupyter_mn import Cluster
from jupyter_mn.errors import JupyterMNError, SpecError
from jupyter_mn.model.workdir import SMALL_FILE, Digests, select
from jupyter_mn.node import files as node_files
from jupyter_mn.node.files import NodeFiles, sees
from jupyter_mn.rank.reload import Reloader
from jupyter_mn.wire.manifest import FileEntry, FileUpdate, changes, content_digest, stamp

LAYOUT = {
    ".gitignore": "*.log\nbuild/\n!keep.log\n",
    "model.py": "x = 1\n",
    "train.log": "",
    "keep.log": "",
    "notes.txt": "",
    "build/gen.py": "",
    "sub/.gitignore": "*.txt\n",
    "sub/notes.txt": "",
    "sub/util.py": "",
    ".git/config": "",
    "pkg/__init__.py": "",
    "pkg/__pycache__/m.cpython-311.pyc": "",
    ".venv/lib/site.py": "",
    "data/rows.py": "",
    "table.csv": "",
}


def make(root: Path, layout: dict[str, str]) -> Path:
    for path, text in layout.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def paths(root: Path, **options) -> list[str]:
    return [f.path for f in select(str(root), **options).files]


def test_gitignore_at_every_level_the_users_patterns_and_what_never_travels(tmp_path):
    root = make(tmp_path, LAYOUT)
    (root / "linked").symlink_to(root / "sub")  # a linked directory is not entered
    (root / "gone.py").symlink_to(root / "nowhere.py")  # a link to nothing holds nothing
    assert paths(root, exclude=("data/", "*.csv")) == [
        ".gitignore",
        "keep.log",
        "model.py",
        "notes.txt",
        "pkg/__init__.py",
        "sub/.gitignore",
        "sub/util.py",
    ]
    assert "table.csv" in paths(root) and "data/rows.py" in paths(root)


def test_large_files_stay_behind_unless_python_and_the_limit_names_the_largest(tmp_path):
    for name, size in (("weights.bin", 200 << 20), ("huge.py", SMALL_FILE + 1)):
        with open(tmp_path / name, "wb") as f:
            f.truncate(size)
    (tmp_path / "small.cfg").write_text("a" * 100)
    chosen = select(str(tmp_path))
    assert [f.path for f in chosen.files] == ["huge.py", "small.cfg"]
    assert [f.path for f in chosen.skipped] == ["weights.bin"]
    with pytest.raises(SpecError) as over:
        select(str(tmp_path), limit=10 << 20)
    message = str(over.value)
    assert "10.0 MiB in 2 files would travel to the nodes, over --workdir-limit 10.0 MiB" in message
    assert message.index("huge.py") < message.index("small.cfg")  # the largest first
    assert "--workdir-exclude PATTERN" in message and "--no-workdir" in message


def test_a_missing_directory_and_an_unreadable_file_are_spec_errors(tmp_path):
    with pytest.raises(SpecError, match="nope: no such directory"):
        select(str(tmp_path / "nope"))
    # root reads everything: the check runs as nobody (after its imports, made as root), on
    # a directory nobody may enter
    root = Path(tempfile.mkdtemp())
    try:
        root.chmod(0o755)
        make(root, {"model.py": "", "secret.py": ""})
        (root / "secret.py").chmod(0)
        nobody = "os.setgid(65534); os.setuid(65534)\n" if os.geteuid() == 0 else ""
        code = "import os\nfrom jupyter_mn.model.workdir import select\n"
        code += f"{nobody}select({str(root)!r})"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert "secret.py: cannot be read" in done.stderr
        assert "leave it out with --workdir-exclude secret.py" in done.stderr
    finally:
        (root / "secret.py").chmod(0o644)
        subprocess.run(["rm", "-rf", str(root)], check=True)


def test_digests_follow_the_content_and_a_file_changed_while_sent_is_refused(tmp_path):
    make(tmp_path, {"a.py": "one", "b.py": "two"})
    digests = Digests()
    first = digests.entries(select(str(tmp_path)))
    assert first["a.py"].digest == content_digest(b"one")
    (tmp_path / "a.py").write_text("three")
    second = digests.entries(select(str(tmp_path)))
    assert second["a.py"].digest == content_digest(b"three")
    assert changes(first, second) == ((second["a.py"],), ())
    (tmp_path / "b.py").unlink()
    assert changes(second, digests.entries(select(str(tmp_path)))) == ((), ("b.py",))
    (tmp_path / "a.py").write_text("four")
    with pytest.raises(JupyterMNError, match=r"a\.py changed while it was being sent"):
        digests.blob(str(tmp_path), second["a.py"])


def test_a_node_keeps_contents_between_gangs_and_its_copy_goes_with_the_gang(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_MN_FILE_CACHE", str(tmp_path / "cache"))
    model = FileEntry("pkg/model.py", content_digest(b"x = 1\n"), 6)
    run = FileEntry("run.sh", content_digest(b"echo\n"), 5, executable=True)
    first = NodeFiles("gang-a")
    assert first.missing([model.digest, run.digest]) == [model.digest, run.digest]
    first.apply(FileUpdate((model, run), (), {model.digest: b"x = 1\n", run.digest: b"echo\n"}))
    folder = Path(first.folder)
    assert (folder / "pkg/model.py").read_text() == "x = 1\n"
    assert os.access(folder / "run.sh", os.X_OK)
    first.apply(FileUpdate((), ("run.sh",)))
    assert not (folder / "run.sh").exists()
    first.remove()
    assert not folder.exists()
    second = NodeFiles("gang-b")  # another gang on the node: only names need to travel
    assert second.missing([model.digest, run.digest]) == []
    second.apply(FileUpdate((model,)))
    assert (Path(second.folder) / "pkg/model.py").read_text() == "x = 1\n"
    with pytest.raises(ValueError, match="not a relative path inside"):
        second.apply(FileUpdate((FileEntry("../escape.py", model.digest, 6),)))
    with pytest.raises(ValueError, match="does not match its digest"):
        second.apply(FileUpdate((), (), {model.digest: b"other"}))
    second.remove()


def test_the_cache_keeps_to_its_limit_dropping_what_was_used_longest_ago(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_MN_FILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(node_files, "CACHE_LIMIT", 250)
    data = [bytes([i]) * 100 for i in range(4)]
    a, b, c, d = (content_digest(x) for x in data)
    node = NodeFiles("gang")
    node.apply(FileUpdate((), (), {a: data[0], b: data[1]}))
    hour = time.time() - 3600
    os.utime(node.cache / a, (hour - 3600, hour - 3600))
    os.utime(node.cache / b, (hour, hour))
    assert node.missing([b]) == []  # b is used again: now the most recent
    node.apply(FileUpdate((), (), {c: data[2]}))  # 300 bytes: the one used longest ago goes
    assert node.missing([a, b, c]) == [a]
    monkeypatch.setattr(node_files, "CACHE_LIMIT", 50)
    node.apply(FileUpdate((), (), {d: data[3]}))  # over, but each was used in the last minutes
    assert node.missing([b, c, d]) == []
    node.remove()


def test_a_node_sees_the_directory_only_with_the_same_files_sizes_and_times(tmp_path):
    make(tmp_path, {"a.py": "one"})
    st = (tmp_path / "a.py").stat()
    expected = stamp([("a.py", st.st_size, st.st_mtime_ns)])
    assert sees(str(tmp_path), ["a.py"], expected)
    os.utime(tmp_path / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # another copy
    assert not sees(str(tmp_path), ["a.py"], expected)
    assert not sees(str(tmp_path / "elsewhere"), ["a.py"], expected)


def test_a_rank_reloads_the_modules_of_its_directory_whose_file_changed(tmp_path, monkeypatch):
    name = f"jmn_reload_{os.getpid()}"
    source = tmp_path / f"{name}.py"
    source.write_text("class Net:\n    def v(self):\n        return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = importlib.import_module(name)
        net = module.Net()
        reloader = Reloader(str(tmp_path))
        reloader.remember()
        assert reloader.reload() == []
        source.write_text(
            textwrap.dedent("""
            class Net:
                def v(self):
                    return 2
        """)
        )
        assert reloader.reload() == [name]
        assert net.v() == 2  # an object made before the edit runs the new code
        assert reloader.reload() == []
        source.write_text("class Net(:\n")
        with pytest.raises(SyntaxError):
            reloader.reload()
        assert Reloader(str(tmp_path / "elsewhere")).reload() == []
    finally:
        sys.modules.pop(name, None)


def test_local_ranks_run_in_the_workdir_and_reload_what_was_edited(
    tmp_path, monkeypatch, no_leftovers
):
    (tmp_path / "model.py").write_text("def version():\n    return 1\n")
    with Cluster(nodes=1, gpus=2, workdir=str(tmp_path)) as cluster:
        first = cluster.run("import os, model\n(os.getcwd(), model.version())", return_all=True)
        assert first.unwrap() == [(str(tmp_path), 1)] * 2
        assert cluster.gang.files.copies == []  # local nodes see it: nothing is sent
        (tmp_path / "model.py").write_text("def version():\n    return 2 * 10\n")
        edited = cluster.run("model.version()", return_all=True)
        assert edited.unwrap() == [20, 20]
        assert "reloaded model: changed since the last cell" in edited.notes
        assert "reloaded" not in " ".join(cluster.run("model.version()").notes)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "model", raising=False)
        from model import version  # the kernel's own import: sent by name, found on the ranks

        assert cluster.launch(version) == 20
        del sys.modules["model"]


SECRETS = {
    ".ssh/id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\nsecret-ssh\n",
    ".aws/credentials": "[default]\naws_secret_access_key = secret-aws\n",
    ".env": "DB_PASSWORD=secret-env\n",
    ".netrc": "machine h login me password secret-netrc\n",
    ".git-credentials": "https://me:secret-git@github.com\n",
    ".kube/config": "token: secret-kube\n",
    ".docker/config.json": '{"auths": {"r": {"auth": "secret-docker"}}}\n',
    ".gnupg/private-keys-v1.d/k.key": "secret-gpg\n",
    "sub/.env.local": "TOKEN=secret-envlocal\n",
    ".local/share/jupyter/runtime/jpserver-1.json": '{"token": "secret-jupyter"}\n',
    "kernel-1234.json": '{"key": "secret-hmac"}\n',
    "deploy/id_ed25519.txt": "-----BEGIN PRIVATE KEY-----\nsecret-pem\n",
    "notes.txt": "aws key AKIA" + "Q" * 16 + " secret-shape\n",
}


def test_credentials_and_links_outside_the_directory_reach_neither_a_node_nor_its_cache(
    tmp_path, monkeypatch
):
    root = make(tmp_path / "notebook", {"model.py": "x = 1\n", "data.yaml": "lr: 1\n", **SECRETS})
    outside = make(tmp_path / "elsewhere", {"aws": "[default]\nkey = secret-outside\n"})
    (root / "creds").symlink_to(outside / "aws")  # `ln -s ~/.aws/credentials creds`
    (root / "same.py").symlink_to(root / "model.py")  # a link inside the directory travels
    (root / "settings").symlink_to(root / ".env")  # but not one to what never does
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(root / "runtime"))
    make(root, {"runtime/jupyter-mn/slurm/g-tls/tls.key": "secret-runtime\n"})
    selection = select(str(root))
    assert [f.path for f in selection.files] == ["data.yaml", "model.py", "same.py"]
    assert dict(selection.withheld) == {
        "creds": "a link to a file outside the directory",
        "deploy/id_ed25519.txt": "it looks like a credential",
        "notes.txt": "it looks like a credential",
        "settings": "a link to a file that is left out",
    }
    # shipped as FileSync ships it: the entries, the contents the node lacks, the update
    monkeypatch.setenv("JUPYTER_MN_FILE_CACHE", str(tmp_path / "cache"))
    entries = Digests().entries(selection)
    node = NodeFiles("gang")
    lacking = node.missing([e.digest for e in entries.values()])
    blobs = {e.digest: Digests().blob(str(root), e) for e in entries.values()}
    node.apply(FileUpdate(tuple(entries.values()), (), {d: blobs[d] for d in lacking}))
    try:
        landed = [p for where in (node.folder, tmp_path / "cache") for p in Path(where).rglob("*")]
        texts = [p.read_text() for p in landed if p.is_file()]
        assert len(texts) == 3 + 2  # the copy's three files, the cache's two contents
        assert not [t for t in texts if "secret" in t]
        assert sorted(p.name for p in Path(node.folder).iterdir()) == [
            "data.yaml",
            "model.py",
            "same.py",
        ]
    finally:
        node.remove()


#: Credential files that once travelled (issue 51): each left behind by its name.
NAMED_SECRETS = {
    "prod.env": "DATABASE_URL=secret-prodenv\n",
    "config/secrets.yaml": "password: secret-yaml\n",
    ".pypirc": "[pypi]\nusername = __token__\npassword = secret-pypirc\n",
    ".databrickscfg": "[DEFAULT]\ntoken = secret-databricks\n",
    ".vault-token": "secret-vault\n",
    ".kaggle/kaggle.json": '{"username": "me", "key": "secret-kaggle"}\n',
    ".config/rclone/rclone.conf": "[s3]\nsecret_access_key = secret-rclone\n",
}


def test_credential_files_by_name_and_a_source_hard_linked_to_a_key_stay_behind(tmp_path):
    sources = {"model.py": "x = 1\n", "secrets.py": "TOKEN_ENV = 'HF_TOKEN'\n"}  # a module
    root = make(tmp_path / "notebook", {**sources, **NAMED_SECRETS})
    key = make(tmp_path / "home", {".ssh/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY-----\n"})
    os.link(key / ".ssh" / "id_ed25519", root / "util.py")  # `ln ~/.ssh/id_ed25519 util.py`
    selection = select(str(root))
    assert [f.path for f in selection.files] == ["model.py", "secrets.py"]
    assert dict(selection.withheld) == {"util.py": "it looks like a credential"}


def test_the_home_directory_and_a_link_in_a_circle_are_refused_with_what_to_do(
    tmp_path, monkeypatch
):
    home = make(tmp_path / "home", {"model.py": ""})
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(SpecError, match=r"home directory: its keys .* --workdir DIR"):
        select(str(home))
    with pytest.raises(SpecError, match=r"home directory"):
        select("~")
    project = make(home / "project", {"model.py": ""})
    assert paths(project) == ["model.py"]  # a folder in it travels
    (project / "loop").symlink_to(project / "loop")
    with pytest.raises(SpecError, match=r"loop: a symbolic link that leads in a circle; .* loop"):
        select(str(project))
