"""The GRUE leaderboard page: tasks x algorithms, best run per cell, RL4LMs paper results alongside."""
