"""Human evaluation: pairwise and Likert annotation campaigns, rankings, agreement, reward models."""
