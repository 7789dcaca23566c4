"""HeteroPP engine: run a Plan (stages of different chip types, TP sizes, layers and recompute) as processes."""
from .config import RunConfig
from .launch import launch
from .reference import train_reference

__all__ = ["RunConfig", "launch", "train_reference"]
