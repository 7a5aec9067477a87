"""Discovery: the per-turn pipeline from a query to a budgeted, tiered answer, and its wire
protocol."""
