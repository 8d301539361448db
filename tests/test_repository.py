"""The repository's own files: layout, docker-compose topology, CI entry point."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_top_level_layout_is_as_designed() -> None:
    for name in (
        "manage.py",
        "pyproject.toml",
        "balancer",
        "dashboard",
        "workers",
        "templates",
        "static",
        "tests",
        "docker-compose.yml",
        "README.md",
        "Makefile",
        ".ci/run",
    ):
        assert (ROOT / name).exists(), name


def test_ci_runs_make_test() -> None:
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_compose_describes_the_production_topology() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {
        "postgres",
        "redis",
        "azurite",
        "dashboard",
        "workers",
        "spark-master",
        "spark-worker",
        "prometheus",
        "grafana",
    } <= set(services)
    assert services["workers"]["deploy"]["replicas"] >= 2
    dockerfile = ROOT / services["dashboard"]["build"]["dockerfile"]
    assert dockerfile.is_file()
    for mount in services["prometheus"]["volumes"]:
        source = mount.split(":")[0]
        assert (ROOT / source).exists(), source


def test_compose_commands_name_real_management_commands() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    commands = [ROOT / package / "management" / "commands" for package in ("workers", "dashboard")]
    for name, service in compose["services"].items():
        command = service.get("command") or []
        if command[:2] == ["python", "manage.py"]:
            assert any((folder / f"{command[2]}.py").is_file() for folder in commands) or command[2] == "migrate", name


def test_compose_keeps_secrets_out_of_the_file() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    for secret in ("POSTGRES_PASSWORD", "DJANGO_SECRET_KEY", "GRAFANA_PASSWORD"):
        assert f"${{{secret}:?" in text
