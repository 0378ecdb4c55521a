"""examples/python/param_server.py: put, get and reduce a tensor as bulk
payloads, every element checked (256 MiB here, to keep the suite short; the
example takes --size 1G)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_param_server(tmp_path):
    example = os.path.join(ROOT, "examples", "python")
    subprocess.run([os.environ["PY_TEST_SLOTRPC_GEN"], "--python", "-o", str(tmp_path),
                    os.path.join(example, "params.fbs")], check=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, os.path.join(example, "param_server.py"), "demo", "--size", "256M"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "all checked" in out.stdout
