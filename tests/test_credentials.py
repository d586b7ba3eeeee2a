import pytest

from jupyter_mn.kernel.credentials import mask_argv

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
        (["python", "-m", "ipykernel_launcher", "-f", "/run/kernel-1.json"], None),
    ],
)
def test_a_command_line_keeps_its_shape_with_credentials_masked(argv, shown):
    assert mask_argv(argv) == (shown or argv)
