import os
import threading

import pytest

from jupyter_mn.errors import CaptureError, SpecError
from jupyter_mn.kernel.cell import CACHE_MIN_BYTES, Shipper, bound_names, compile_cell, free_names


def test_free_names_follow_scopes_not_an_ast_walk():
    code = compile_cell(
        "def g(z):\n    return z * SCALE\n"
        "y = [f(i) for i in range(3)]\n"
        "class K:\n    attr = BASE\n"
        "print(g(2), undefined_here)\n"
    )
    assert free_names(code) == {"SCALE", "f", "BASE", "print", "range", "undefined_here"}


def test_names_bound_by_the_cell_are_not_captured():
    code = compile_cell(
        "import os\nx = 1\nfor i in range(2):\n    x += i\ndef h():\n"
        "    global w\n    w = 1\nh()\nprint(x, w)"
    )
    assert "x" not in free_names(code) and "os" not in free_names(code)
    assert "w" not in free_names(code)
    assert {"os", "x", "i", "h"} <= bound_names(code)


def test_magic_arguments_are_analysed_too():
    code = compile_cell("%time y = compute(DATA)\n!echo hi")
    assert {"compute", "DATA"} <= free_names(code)


def test_syntax_error_shows_the_cells_line_and_caret():
    with pytest.raises(SpecError) as info:
        compile_cell("x = 1\ny = (2 +\nz = 3\n")
    assert "line 2" in str(info.value) or "line 3" in str(info.value)
    assert "SyntaxError in the cell" in str(info.value)


def test_a_top_level_await_is_refused_before_the_cell_ships():
    """The ranks run cells without IPython's autoawait (rank/execute.py) because of this."""
    with pytest.raises(SpecError, match="line 2: 'await' outside function"):
        compile_cell("import asyncio\nawait asyncio.sleep(0)\n")


def test_empty_cell_is_refused():
    with pytest.raises(SpecError, match="the cell is empty"):
        compile_cell("  \n\n")


def test_capture_lists_every_unpicklable_variable_with_its_offending_part(tmp_path):
    class Holder:
        def __init__(self):
            self.cfg = {"log": open(tmp_path / "x.log", "w")}  # noqa: SIM115

    ns = {"lock": threading.Lock(), "gen": (i for i in range(3)), "holder": Holder(), "ok": 3}
    code = compile_cell("print(lock, gen, holder, ok)")
    with pytest.raises(CaptureError) as info:
        Shipper().capture(code, ns)
    text = str(info.value)
    assert "'lock' of type lock" in text
    assert "'gen' of type generator" in text
    assert "holder.cfg['log'] of type TextIOWrapper" in text
    assert "'ok'" not in text
    ns["holder"].cfg["log"].close()


def test_capture_sends_functions_and_classes_by_value():
    import cloudpickle

    ns: dict = {}
    exec("SCALE = 3\ndef f(x):\n    return x * SCALE\nclass C:\n    v = 2", ns)
    names, notes = Shipper().capture(compile_cell("f(C.v)"), ns)
    assert [c.name for c in names] == ["C", "f"] and notes == ()
    assert cloudpickle.loads(names[1].data)(2) == 6  # f and its global SCALE go by value


def test_a_large_bytes_name_leaves_the_pickle_as_an_array_does_and_comes_back_as_bytes():
    from jupyter_mn.wire import sharednames
    from jupyter_mn.wire.payload import CellPayload
    from jupyter_mn.wire.values import OUT_OF_BAND_BYTES

    blob = os.urandom(4 * OUT_OF_BAND_BYTES)
    (captured,), _ = Shipper().capture(compile_cell("len(blob)"), {"blob": blob})
    assert len(captured.data) < 1000 and [memoryview(b).nbytes for b in captured.buffers] == [
        len(blob)
    ]
    shared = sharednames.SharedNames(CellPayload("", 0, names=(captured,)))
    try:  # as a rank of this host gets it: one file, mapped
        back = sharednames.loads(shared.payload.names[0])
    finally:
        shared.close()
    assert back == blob and type(back) is bytes


def test_rank_defined_names_stay_rank_local_unless_pushed():
    ns = {"model": 1, "lr": 0.1}
    code = compile_cell("model, lr")
    names, _ = Shipper().capture(code, ns, rank_defined={"model"})
    assert [c.name for c in names] == ["lr"]
    names, _ = Shipper().capture(code, ns, rank_defined={"model"}, push=["model"])
    assert sorted(c.name for c in names) == ["lr", "model"]
    with pytest.raises(SpecError, match="--push names not defined in the notebook: nope"):
        Shipper().capture(code, ns, push=["nope"])


def test_credentials_are_not_sent_unless_pushed():
    ns = {"api_token": "abc", "key": "ghp_" + "a" * 36, "data": [1]}
    code = compile_cell("api_token, key, data")
    names, notes = Shipper().capture(code, ns)
    assert [c.name for c in names] == ["data"]
    assert len(notes) == 2 and "--push api_token" in " ".join(notes)
    names, _ = Shipper().capture(code, ns, push=["api_token"])
    assert "api_token" in [c.name for c in names]


#: Credentials the filter recognises by their value or by what holds them (issue 27's cases);
#: each is built at run time so no token-shaped literal sits in the source.
_TOKEN = "hf_" + "Ab1" * 12
_HELD = """
import functools
openai_key = "sk_live_" + "x9" * 12
config = {"api_key": "abc", "lr": 0.1}
pem = "-----BEGIN RSA PRIVATE KEY-----\\nMIIEow\\n-----END RSA PRIVATE KEY-----"
jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N"
db = "postgresql://ml:hunter2@db.internal:5432/runs"
raw = token.encode()
def make():
    t = token
    def call():
        return t
    return call
closure = make()
def default(url, auth=token):
    return url, auth
def kwdefault(url, *, header=("Bearer", token)):
    return url
partial = functools.partial(print, token)
"""


@pytest.mark.parametrize(
    "name",
    [
        "openai_key",
        "config",
        "pem",
        "jwt",
        "db",
        "raw",
        "closure",
        "default",
        "kwdefault",
        "partial",
    ],
)
def test_credentials_are_recognised_by_value_and_inside_what_holds_them(name):
    ns: dict = {"token": _TOKEN}
    exec(_HELD, ns)
    names, notes = Shipper().capture(compile_cell(name), ns)
    assert names == () and len(notes) == 1 and f"not sending {name!r}" in notes[0]
    assert [c.name for c in Shipper().capture(compile_cell(name), ns, push=[name])[0]] == [name]


def test_ordinary_values_that_resemble_credentials_are_sent():
    ns: dict = {
        "url": "https://example.com/data?x=1",
        "keys": ["a", "b"],
        "skip": "sk-short",
        "scale": lambda x, factor=2: x * factor,
        "text": "eyJ alone is no JWT",
    }
    names, notes = Shipper().capture(compile_cell("url, keys, skip, scale, text"), ns)
    assert sorted(c.name for c in names) == sorted(ns) and notes == ()


def test_notebook_code_reading_a_credential_is_not_sent_unless_the_credential_is_pushed():
    import cloudpickle

    ns: dict = {}
    exec(
        "API_TOKEN = 's3cr3t-value'\nURL = 'https://x'\n"
        "def headers():\n    return {'Authorization': API_TOKEN}\n"
        "def call():\n    return URL, headers()\n"
        "class Client:\n    @property\n    def auth(self):\n        return headers()\n"
        "client = Client()\n",
        ns,
    )
    code = compile_cell("call(), client.auth, URL")
    names, notes = Shipper().capture(code, ns)
    assert [c.name for c in names] == ["URL"]
    assert notes == tuple(
        f"not sending {name!r}: it reads API_TOKEN, which looks like a credential "
        "(use --push API_TOKEN to send it along)"
        for name in ("call", "client")
    )
    names, notes = Shipper().capture(code, ns, push=["API_TOKEN"])
    assert [c.name for c in names] == ["API_TOKEN", "URL", "call", "client"] and notes == ()
    assert cloudpickle.loads(names[2].data)() == ("https://x", {"Authorization": "s3cr3t-value"})


def test_large_values_are_sent_once_then_referenced():
    shipper = Shipper()
    ns = {"blob": b"x" * CACHE_MIN_BYTES, "small": 1}
    code = compile_cell("len(blob), small")
    first = shipper.for_ranks(shipper.capture(code, ns)[0])
    again = shipper.for_ranks(shipper.capture(code, ns)[0])
    assert {c.name: c.data is not None for c in first} == {"blob": True, "small": True}
    assert {c.name: c.data is not None for c in again} == {"blob": False, "small": True}
    ns["blob"] = b"y" * CACHE_MIN_BYTES
    changed = shipper.for_ranks(shipper.capture(code, ns)[0])
    assert dict((c.name, c.data is not None) for c in changed)["blob"]
    captured, _ = shipper.capture(code, ns)
    assert all(c.data is not None for c in captured)  # the bytes stay, for new ranks
    shipper.forget()
    assert all(c.data is not None for c in shipper.for_ranks(captured))


def test_a_gang_on_this_host_gets_large_values_every_time_without_a_digest():
    shipper = Shipper()
    ns = {"blob": b"x" * CACHE_MIN_BYTES}
    code = compile_cell("len(blob)")
    for _ in range(2):
        (sent,) = shipper.for_ranks(shipper.capture(code, ns)[0], cache=False)
        assert sent.data is not None and sent.digest == ""
    (cached,) = shipper.for_ranks(shipper.capture(code, ns)[0])  # another host: it is held
    assert cached.data is not None and len(cached.digest) == 32


def test_ipython_and_rank_names_are_never_captured():
    ns = {"get_ipython": object(), "torch": object(), "_": 1, "_i3": "x", "In": [], "print": print}
    names, _ = Shipper().capture(compile_cell("get_ipython, torch, _, _i3, In, print"), ns)
    assert names == ()
