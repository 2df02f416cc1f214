"""`eaglekit run`: every stage, chained from one recipe, each resumable and each runnable alone."""
