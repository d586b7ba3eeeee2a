import pytest

from jupyter_mn.gang.slurm.provision import job_environ
from jupyter_mn.model import credentials
from jupyter_mn.model.credentials import holds_secret, mask_argv

TOKEN = "ghp_" + "k2" * 18


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (
            ["jupyter-lab", "--IdentityProvider.token=abc", "--no-browser"],
            ["jupyter-lab", "--IdentityProvider.token=***", "--no-browser"],
        ),
        (
            ["papermill", "/tmp/token/in.ipynb", "out.ipynb", "-p", "db_password", "pw"],
            ["papermill", "/tmp/token/in.ipynb", "out.ipynb", "-p", "db_password", "***"],
        ),
        (
            ["train.py", "--password", "pw", "--lr", "0.1"],
            ["train.py", "--password", "***", "--lr", "0.1"],
        ),
        (["run", TOKEN, f"--url=https://me:{TOKEN}@host/x"], ["run", "***", "--url=***"]),
        (
            ["jupyter mn", "submit", "--env", "WANDB_API_KEY=k1", "--env=SEED=7", "nb.ipynb"],
            ["jupyter mn", "submit", "--env", "WANDB_API_KEY=***", "--env=SEED=***", "nb.ipynb"],
        ),
        (["python", "-m", "ipykernel_launcher", "-f", "/run/kernel-1.json"], None),
    ],
)
def test_a_command_line_keeps_its_shape_with_credentials_masked(argv, shown):
    assert mask_argv(argv) == (shown or argv)


#: Names and shapes the filter once let through (issue 42), each built at run time so that no
#: credential-shaped literal sits in the source: (name, value).
BYPASSES = [
    ("MYSQL_PWD", "hunter2"),
    ("SSHPASS", "hunter2"),
    ("DB_PASS", "hunter2"),
    ("LDAP_BINDPW", "hunter2"),
    ("SIGNING_KEY", "3q2+7w" + "Zx9Qk2Lm" * 3 + "=="),
    ("KAGGLE_KEY", "0f1e2d3c" * 4),
    (
        "AZURE_STORAGE_CONNECTION_STRING",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey="
        + "Ab3+" * 11
        + "==;EndpointSuffix=core.windows.net",
    ),
    ("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/" + "T0AB1CD2E/B0FG3HI4J/" + "k9" * 12),
    ("DATABASE", "postgres://u:" + "p/ss" + "@db/x"),
    ("GOOGLE", "ya29." + "a0AfH6SMB" * 3),
    ("NPMRC", "npm_" + "aB3" * 12),
    ("STRIPE", "rk_live_" + "51Hx" * 6),
    ("AWS_ID", "ASIA" + "Q7XK" * 4),
    # issue 51
    ("DB_URL", "postgres://u:" + "123/abc" + "@h"),
    ("UPLOAD", "pypi-" + "AgEIcHlwaS5vcmc" * 3),
    ("CONN", "Driver={ODBC Driver 18};Server=db;UID=me;" + "Password=hunter2;"),
    ("CONN_LAST", "Server=db;UID=me;" + "PWD=hunter2"),
]


@pytest.mark.parametrize(("name", "value"), BYPASSES, ids=[n for n, _ in BYPASSES])
def test_each_credential_that_once_slipped_through_is_caught(name, value):
    assert holds_secret(name, value)
    assert holds_secret("cfg", {"a": [{"b": {name: value}}]})  # four levels down
    assert job_environ({name: value, "PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}


def test_neighbours_of_those_names_and_shapes_are_no_credentials():
    for name, value in [
        ("PWD", "/home/me/project"),
        ("OLDPWD", "/home/me"),
        ("sort_key", "date"),
        ("label_key", "input_ids_attention"),
        ("url", "https://example.com:8080/users/@me"),
        ("registry", "https://registry.local:4873/@scope/pkg"),
        ("PATH", "/usr/local/bin:/usr/bin"),
        ("webhook_doc", "https://api.slack.com/messaging/webhooks"),
        ("conn", "Driver={ODBC Driver 18};Server=db;Trusted_Connection=yes;"),
        ("blank", "Server=db;Password=;"),
        ("mastodon", "https://mastodon.social:443/@me"),
    ]:
        assert not holds_secret(name, value), (name, value)


class Settings:
    def __init__(self, token: str) -> None:
        self.name = "run"
        self.inner = {"deep": [{"deeper": (token,)}]}


def test_a_value_is_searched_to_the_end_or_taken_for_a_credential_when_too_large(monkeypatch):
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----"
    assert holds_secret("text", "x" * (1 << 17) + pem)  # past 64 KiB
    assert holds_secret("data", ("x" * (1 << 17) + pem).encode())
    wide = {f"k{i}": i for i in range(65)} | {"api_key": "abc"}
    assert holds_secret("cfg", wide)
    assert holds_secret("cfg", {"a": {"b": {"c": {"d": "x", "api_key": "abc"}}}})
    assert holds_secret("settings", Settings("ghp_" + "k2" * 18))
    assert not holds_secret("settings", Settings("plain"))
    ring: list = []
    ring.append(ring)
    assert not holds_secret("ring", ring)  # a cycle ends
    assert not holds_secret("rows", list(range(100_000)))
    monkeypatch.setattr(credentials, "_ITEM_BUDGET", 1000)
    assert holds_secret("rows", list(range(1001)))  # too large to search: not sent
