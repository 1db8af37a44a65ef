"""What only worker processes run: the task queue's tasks, the jobs that run a session's actions, publishing their
typed events, and noticing the replies of workers that died."""
