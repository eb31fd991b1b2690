"""The chart, and the tools that render and test it (helm, helm-unittest,
promtool, built by hack/tools/build)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


CHART = ROOT / "charts" / "hooklane"


# A token for the API, which the chart refuses to run without.
INGEST_TOKEN = "chart-test-token-0123456789"


# The release the promtool tests' series are labelled for.
RELEASE = ("hooklane", "hooklane")


@dataclass(frozen=True)
class Tools:
    folder: Path
    env: dict[str, str]

    def run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.folder / tool), *args], env=self.env, capture_output=True, text=True, timeout=300
        )
        if check and done.returncode != 0:
            pytest.fail(f"{tool} {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("helm", *args, check=check)

    def render(self, *args: str, release: tuple[str, str] = RELEASE) -> list[dict[str, Any]]:
        name, namespace = release
        out = self.helm("template", name, str(CHART), "--namespace", namespace, *args).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="session")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Tools:
    build = subprocess.run([str(ROOT / "hack" / "tools" / "build")], capture_output=True, text=True)
    if build.returncode != 0:
        pytest.fail(f"hack/tools/build exited {build.returncode}:\n{build.stderr[-4000:]}")
    folder = Path(build.stdout.strip().splitlines()[-1])
    # Helm's own folders in a temporary home, so that neither the user's
    # repositories and plugins nor their kubeconfig take part.
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "HELM_PLUGINS": str(folder / "helm-plugins"),
        "KUBECONFIG": str(home / "no-kubeconfig"),
    }
    return Tools(folder, env)


EVERYTHING = CHART / "tests" / "values" / "everything.yaml"


REQUIRED = ["--set", "database.existingSecret=pg", "--set", f"api.tokens.ingest[0]={INGEST_TOKEN}"]
