"""The cost and capacity model: one inventory, cost per request reconciled to the bill, capacity."""
