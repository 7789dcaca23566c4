"""The one spec loader: cluster, model (with presets) and training specs from YAML or JSON."""
from .cluster import ChipType, Cluster, cluster_from_dict, load_cluster
from .errors import InfeasibleError, SpecError
from .model import PRESETS, ModelSpec, load_model, model_from_dict
from .training import SCHEDULES, TrainSpec, load_train, train_from_dict

__all__ = ["ChipType", "Cluster", "cluster_from_dict", "load_cluster", "InfeasibleError", "SpecError", "PRESETS",
           "ModelSpec", "load_model", "model_from_dict", "SCHEDULES", "TrainSpec", "load_train", "train_from_dict"]
