"""Which files of the notebook's working directory travel to nodes that do not see it.

A notebook imports its neighbours (``from model import Net``) and reads files beside it; a node
whose filesystem is not the kernel's (a pod, a worker elsewhere) gets a copy. What travels: the
directory's files less ``.gitignore``'s (each directory's own, as git reads them), the user's
``--workdir-exclude`` patterns and what never belongs on a node (version control, caches,
environments, and credentials: ``CREDENTIALS`` by name, other files by content, a hard-linked
Python source too); Python sources of any size and other files up to ``SMALL_FILE``; all of it
within ``--workdir-limit``. A link to a file outside the directory is not followed, and the home
directory is not sent at all: copies land in every node's working directory and a cache that
outlives the gang. Everything is checked here, in the kernel, before anything starts.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from jupyter_core.paths import jupyter_runtime_dir
from pathspec import GitIgnoreSpec

from ..errors import JupyterMNError, SpecError
from ..wire.manifest import FileEntry, content_digest, stamp
from ..wire.sizes import size_text
from .credentials import secret_value
from .spec import WORKDIR_LIMIT, ClusterSpec

#: Files over this size travel only when they are Python sources (data and checkpoints belong
#: on storage the nodes share).
SMALL_FILE = 10 << 20
#: Never sent: version control, caches, environments (a ``.venv`` holds thousands of sources).
ALWAYS_EXCLUDED = (
    ".git/",
    ".hg/",
    ".svn/",
    "__pycache__/",
    "*.pyc",
    ".ipynb_checkpoints/",
    ".venv/",
    "venv/",
    "node_modules/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".hypothesis/",
    ".tox/",
)
#: Never sent, wherever they are in the directory: keys, tokens and passwords by their usual
#: names, and Jupyter's runtime files (the server's token, the kernels' HMAC keys, a gang's TLS
#: key). A ``!pattern`` in a ``.gitignore`` does not bring them back.
CREDENTIALS = (
    ".ssh/",
    ".aws/",
    ".azure/",
    ".kube/",
    ".gnupg/",
    ".docker/",
    "**/.config/gcloud/",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".git-credentials",
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    *(f"secrets.{ext}" for ext in ("yaml", "yml", "json", "toml", "ini", "cfg", "txt")),
    ".pypirc",
    ".databrickscfg",
    ".vault-token",
    "**/.kaggle/",
    "**/.config/rclone/",
    "**/.local/share/jupyter/runtime/",
    "kernel-*.json",
    "jpserver-*.json",
)
#: Files other than Python sources up to this size are read, and left behind when their
#: content looks like a credential (``credentials.secret_value``): a key or a token file under
#: another name. Python sources travel as they are (the ranks import them), unless hard-linked:
#: a file with another name may be anything under this one (``ln ~/.ssh/id_rsa util.py``).
SCANNED = 1 << 20
#: How many of the largest files an over-the-limit error names.
_NAMED = 5


@dataclass(frozen=True)
class Listed:
    """A file chosen to travel, as the kernel sees it now."""

    path: str
    size: int
    mtime_ns: int
    inode: int
    executable: bool


@dataclass(frozen=True)
class Selection:
    """The files of ``root`` that travel, and the large ones left out (for the cell's note)."""

    root: str
    files: tuple[Listed, ...] = ()
    skipped: tuple[Listed, ...] = ()
    #: files left behind for what they hold or where they lead: (path, why), for the note
    withheld: tuple[tuple[str, str], ...] = ()

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def stamp(self) -> str:
        """How a node tells that it sees these very files (``manifest.stamp``)."""
        return stamp((f.path, f.size, f.mtime_ns) for f in self.files)


def directory(workdir: str | None) -> str:
    """The directory that travels, as an absolute path: ``workdir``, else the kernel's working
    directory; ``SpecError`` if it is not a directory."""
    root = os.path.abspath(os.path.expanduser(workdir) if workdir else os.getcwd())
    if not os.path.isdir(root):
        raise SpecError(f"--workdir {root}: no such directory")
    return root


def for_spec(spec: ClusterSpec) -> Selection | None:
    """What ``spec``'s gang sends to nodes that do not see the directory (None: nothing
    travels); ``SpecError`` for bad input, before anything starts. Local nodes are this
    machine: nothing is listed for them."""
    if not spec.send_workdir:
        return None
    root = directory(spec.workdir)
    if spec.backend == "local":
        return Selection(root)
    return select(root, spec.workdir_exclude, spec.workdir_limit)


def select(root: str, exclude: Sequence[str] = (), limit: int = WORKDIR_LIMIT) -> Selection:
    """The files of ``root`` that travel; ``SpecError`` for a directory that is not there or is
    the home directory, a file that cannot be read, a link in a circle, or more than ``limit``
    bytes (naming the largest files)."""
    root = directory(root)
    if os.path.realpath(root) == os.path.realpath(os.path.expanduser("~")):
        raise SpecError(
            f"{root} is your home directory: its keys and tokens would travel to the nodes "
            "with it. Start the notebook in a project's folder, name one with --workdir DIR, "
            "or send nothing with --no-workdir"
        )
    files, skipped, withheld = [], [], []
    for path, st in _walk(root, exclude, withheld):
        full = os.path.join(root, path)
        if not os.access(full, os.R_OK):
            raise SpecError(
                f"{full}: cannot be read, so it cannot be sent to the nodes; "
                f"leave it out with --workdir-exclude {path}"
            )
        listed = Listed(path, st.st_size, st.st_mtime_ns, st.st_ino, bool(st.st_mode & 0o111))
        python = path.endswith(".py")
        scanned = not python or st.st_nlink > 1
        if scanned and st.st_size <= SCANNED and _looks_secret(full, listed):
            withheld.append((path, "it looks like a credential"))
            continue
        (files if python or st.st_size <= SMALL_FILE else skipped).append(listed)
    selection = Selection(root, tuple(files), tuple(skipped), tuple(withheld))
    if selection.total > limit:
        raise SpecError(_too_large(selection, limit))
    return selection


def _too_large(selection: Selection, limit: int) -> str:
    largest = sorted(selection.files, key=lambda f: -f.size)[:_NAMED]
    named = "\n".join(f"  {size_text(f.size):>9}  {f.path}" for f in largest)
    return (
        f"{selection.root}: {size_text(selection.total)} in {len(selection.files)} files would "
        f"travel to the nodes, over --workdir-limit {size_text(limit)}. The largest:\n{named}\n"
        "Leave files out with --workdir-exclude PATTERN (or a .gitignore), raise "
        "--workdir-limit, or send nothing with --no-workdir."
    )


@functools.lru_cache(maxsize=4096)
def _looks_secret(full: str, listed: Listed) -> bool:
    """Whether the file's content looks like a credential (read again only once it changed)."""
    try:
        with open(full, "rb") as f:
            return secret_value(f.read(SCANNED))
    except OSError:
        return False  # read again when it is sent, which says why it cannot be


def _walk(
    root: str, exclude: Sequence[str], withheld: list[tuple[str, str]]
) -> Iterator[tuple[str, os.stat_result]]:
    """Regular files under ``root`` (relative, ``/``-separated, sorted) that no rule leaves out.

    An ignored directory is not entered (as git: nothing inside it can be re-included), nor
    is a linked one (it may lead anywhere, or in a circle). A link to a file that is gone holds
    nothing and is passed over; one to a file outside ``root``, or to one that never travels,
    is added to ``withheld``; one in a circle is a ``SpecError``.
    """
    never = GitIgnoreSpec.from_lines([*ALWAYS_EXCLUDED, *CREDENTIALS, *exclude])
    inside = os.path.join(os.path.realpath(root), "")
    runtime = os.path.realpath(jupyter_runtime_dir())  # wherever JUPYTER_RUNTIME_DIR puts it
    # each directory's .gitignore files, from the top: (where it is, its rules)
    rules: dict[str, list[tuple[str, GitIgnoreSpec]]] = {"": []}

    def refuse(error: OSError) -> None:
        raise SpecError(f"{error.filename}: cannot be read ({error.strerror})")

    for here, dirs, names in os.walk(root, onerror=refuse):
        rel = Path(here).relative_to(root).as_posix()
        rel = "" if rel == "." else rel
        levels = rules.pop(rel)
        own = os.path.join(here, ".gitignore")
        if os.path.isfile(own):
            with open(own, encoding="utf-8", errors="replace") as f:
                levels = [*levels, (rel, GitIgnoreSpec.from_lines(f.read().splitlines()))]
        kept = []
        for name in sorted(dirs):
            path = f"{rel}/{name}" if rel else name
            full = os.path.join(here, name)
            if os.path.islink(full) or _ignored(never, levels, path + "/"):
                continue
            if os.path.realpath(full) == runtime:
                continue
            kept.append(name)
            rules[path] = levels
        dirs[:] = kept
        for name in sorted(names):
            path = f"{rel}/{name}" if rel else name
            if _ignored(never, levels, path):
                continue
            full = os.path.join(here, name)
            try:
                st = os.stat(full)
            except FileNotFoundError:  # a link to nothing
                continue
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise SpecError(f"{full}: cannot be read ({exc.strerror})") from None
                raise SpecError(
                    f"{full}: a symbolic link that leads in a circle; remove it or leave it "
                    f"out with --workdir-exclude {path}"
                ) from None
            if os.path.islink(full):
                target = os.path.realpath(full)
                if not target.startswith(inside):
                    withheld.append((path, "a link to a file outside the directory"))
                    continue
                if never.match_file(target[len(inside) :]):  # `ln -s .env settings`
                    withheld.append((path, "a link to a file that is left out"))
                    continue
            if stat.S_ISREG(st.st_mode):
                yield path, st


def _ignored(never: GitIgnoreSpec, levels: list[tuple[str, GitIgnoreSpec]], path: str) -> bool:
    """Whether a rule leaves ``path`` out: ours and the user's always; else the deepest
    ``.gitignore`` with a rule for it (a ``!pattern`` there brings it back)."""
    if never.match_file(path):
        return True
    ignored = False
    for where, spec in levels:
        below = path[len(where) + 1 :] if where else path
        found = spec.check_file(below).include
        if found is not None:
            ignored = found
    return ignored


class Digests:
    """The content digest of each file chosen to travel, read again only when its size, time
    or inode changed (every cell of a gang with copies lists the directory)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int, int], str] = {}

    def entries(self, selection: Selection) -> dict[str, FileEntry]:
        """The selection as manifest entries, by path."""
        known: dict[tuple[str, int, int, int], str] = {}
        out = {}
        for f in selection.files:
            key = (f.path, f.size, f.mtime_ns, f.inode)
            digest = self._known.get(key) or content_digest(self._read(selection.root, f.path))
            known[key] = digest
            out[f.path] = FileEntry(f.path, digest, f.size, f.executable)
        self._known = known
        return out

    @staticmethod
    def _read(root: str, path: str) -> bytes:
        try:
            return Path(root, path).read_bytes()
        except OSError as exc:
            raise JupyterMNError(f"{Path(root, path)}: cannot be read ({exc.strerror})") from None

    def blob(self, root: str, entry: FileEntry) -> bytes:
        """``entry``'s bytes, read now; an error if the file changed since it was listed."""
        data = self._read(root, entry.path)
        if content_digest(data) != entry.digest:
            raise JupyterMNError(
                f"{Path(root, entry.path)} changed while it was being sent; run the cell again"
            )
        return data
