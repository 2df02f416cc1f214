"""`eaglekit report`: one self-contained HTML page of a run folder (training, scaling, acceptance, speed, doctor)."""
