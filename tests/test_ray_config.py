"""The Ray settings of a config file and the command line (`ray:`, `autoscaling`,
`ray_actor_options`, `--ray`), and the server without `--ray` never importing Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlxcel.config.file import ConfigError, read_config


def test_the_config_file_sets_the_cluster_and_each_models_placement(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "ray:\n  address: 10.0.0.1:6379\n  start_timeout: 20\nmodels:\n  - model: a.gguf\n"
        "    autoscaling: {min_replicas: 1, max_replicas: 4, target_ongoing_requests: 2}\n"
        "    ray_actor_options: {num_cpus: 2, resources: {big: 1}}\n"
    )
    file = read_config(path)
    assert file.server["ray_address"] == "10.0.0.1:6379"
    assert file.server["ray_start_timeout"] == 20.0
    values = file.models[0].values
    assert values["autoscaling"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 2.0,
    }
    assert values["ray_actor_options"] == {"num_cpus": 2, "resources": {"big": 1}}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("ray: {port: 1}\n", "ray: the ray section has the keys address"),
        ("ray: {address: auto, start_timeout: -1}\n", "ray: start_timeout must be a number"),
        (
            "models:\n  - model: a.gguf\n    autoscaling: {min_replicas: 3, max_replicas: 2}\n",
            "autoscaling: it needs 1 <= min_replicas <= max_replicas <= 64",
        ),
        (
            "models:\n  - model: a.gguf\n    autoscaling: {replicas: 2}\n",
            "unknown key 'replicas'",
        ),
        (
            "models:\n  - model: a.gguf\n    ray_actor_options: {num_cpus: -1}\n",
            "ray_actor_options: num_cpus must be a number, at least 0",
        ),
    ],
)
def test_bad_ray_settings_are_refused(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "models.yaml"
    body = text if text.startswith("models") else text + "models:\n  - model: a.gguf\n"
    path.write_text(body)
    with pytest.raises(ConfigError, match=problem.replace("[", "\\[")):
        read_config(path)


def test_the_server_without_ray_never_imports_it() -> None:
    code = (
        "import sys, mlxcel.cli.main, mlxcel.api.app, mlxcel.models.registry;"
        "print('ray' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
