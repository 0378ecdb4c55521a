"""README.md's first Python service runs as it stands."""

import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_readme_python_sample(tmp_path):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = re.search(r"<!-- sample:python-first-service -->\n```python\n(.*?)```", readme, re.S)
    assert m, "README.md has no python-first-service sample"
    assert len(m.group(1).splitlines()) < 30, "the README's first Python service must stay under 30 lines"
    shutil.copy(os.path.join(ROOT, "examples", "echo", "echo.fbs"), tmp_path)
    subprocess.run([os.environ["PY_TEST_SLOTRPC_GEN"], "--python", "-o", ".", "echo.fbs"], cwd=tmp_path, check=True)
    (tmp_path / "first_service.py").write_text(m.group(1))
    out = subprocess.run([sys.executable, "first_service.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "seq 1, 3 bytes"
