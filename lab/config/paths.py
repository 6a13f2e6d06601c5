"""Where lab-train's config groups live (conf/ beside the package): lab-train, lab-resume and lab-eval compose from it."""

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
