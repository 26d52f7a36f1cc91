"""The pipeline layer: stage topologies, the runtime that places and connects stages, request handles."""

from omni_core.pipeline.handle import (
    ClusterLost,
    DeadlineExceeded,
    OutputEvent,
    RequestFailed,
    RequestHandle,
    StageUnavailable,
)
from omni_core.pipeline.runtime import Pipeline, PipelineFull
from omni_core.pipeline.segmented import SegmentedHandle
from omni_core.pipeline.topology import Edge, StageSpec, Topology, TopologyError
from omni_core.pipeline.validation import JOINED_PORT, validate_topology
from omni_core.scheduler.executor import Message, StageContext

__all__ = [
    "ClusterLost",
    "JOINED_PORT",
    "DeadlineExceeded",
    "Edge",
    "Message",
    "OutputEvent",
    "Pipeline",
    "PipelineFull",
    "RequestFailed",
    "RequestHandle",
    "SegmentedHandle",
    "StageUnavailable",
    "StageContext",
    "StageSpec",
    "Topology",
    "TopologyError",
    "validate_topology",
]
