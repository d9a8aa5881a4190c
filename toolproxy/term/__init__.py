"""What a person at a terminal is shown: progress lines, printable text (model output never
reaches a terminal raw), quantities as people write them, and failed connections in words a user
can act on."""
