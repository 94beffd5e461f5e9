"""Planning maths: spot against dedicated cost, the checkpoint interval, and scaling efficiency."""
