"""Arenas, memory nodes and handles: where data lives and how it stays coherent."""

from .arena import Arena, ArenaPair, ArenaStats
from .handle import Handle
from .memory import MemoryNode, host_nodes

__all__ = ["Arena", "ArenaPair", "ArenaStats", "Handle", "MemoryNode", "host_nodes"]
