"""Features for draft training: the target's aux states and its next-token teacher.

Offline (`eaglekit features`): captured once into sharded safetensors with an index and manifest.
Online: computed per batch by the co-resident target during `eaglekit train --data`.
"""
