"""Helpers shared by the unit and integration tests (no tests here)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = ROOT / ".models"
