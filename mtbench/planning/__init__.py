"""The Planner: which memory plan a job runs under its budget, chosen by prediction or by probe steps."""
