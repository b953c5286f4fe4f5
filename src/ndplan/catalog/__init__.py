"""Catalogs: models (HF config.json field names) and hardware, each entry one YAML."""

from ndplan.catalog.model import ModelSpec, load_model, list_models
from ndplan.catalog.hardware import Hardware, load_hardware, list_hardware

__all__ = ["ModelSpec", "load_model", "list_models", "Hardware", "load_hardware", "list_hardware"]
