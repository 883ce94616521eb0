# The entries (the pin line and its --hash lines) of the packages named in `names` (space-separated, any case)
# in a hashed requirements lock, as a requirements file of their own:
#   awk -v names="pip setuptools" -f scripts/lock_entries.awk requirements.lock
# scripts/setup.sh and docker/Dockerfile install pip and setuptools from them before the rest of the lock.
BEGIN { n = split(tolower(names), list, " "); for (i = 1; i <= n; i++) want[list[i]] = 1 }
/^[A-Za-z0-9]/ { split($0, pin, "=="); keep = (tolower(pin[1]) in want) }
keep
