"""The planner: hardware + model size + memory model -> backend choice with reasons. No torch here."""
