"""What the reducers are compared against."""
