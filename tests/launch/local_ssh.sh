#!/bin/bash
# Two "hosts" on this machine for DeepSpeed's pdsh launcher: an sshd of our own on a free 127.0.0.1 port, a throwaway
# key pair, and the aliases node-a and node-b, both reaching it. Nothing outside DIR changes: not the system sshd,
# not ~/.ssh (only /run/sshd is created when missing, as sshd insists on it when it runs as root).
#   tests/launch/local_ssh.sh up   [DIR]   start it (DIR default: /tmp/diffllm-ssh); prints `export PATH=DIR/bin:$PATH`
#   tests/launch/local_ssh.sh down [DIR]   stop that sshd and delete the keys and configs it wrote under DIR
# DIR/bin/ssh runs `ssh -F DIR/ssh_config "$@"`: with DIR/bin first on PATH, DeepSpeed's own `ssh HOST hostname`
# check, pdsh's ssh module and `diffllm launch`'s reachability check all use our config; every other host falls
# through to ~/.ssh/config and /etc/ssh/ssh_config as usual. Needs Debian's openssh-server, openssh-client and pdsh
# (`apt-get install openssh-server pdsh`; `make test-packages` does it as root). tests/launch/ssh_hosts.py starts and
# stops these hosts with this script.
set -euo pipefail

cmd=${1:-}
DIR=$(realpath -m "${2:-/tmp/diffllm-ssh}")
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
HOSTS="node-a node-b"
# what `up` writes and `down` deletes (DIR itself goes only when nothing else is left in it)
FILES="ssh_host_ed25519_key ssh_host_ed25519_key.pub id_ed25519 id_ed25519.pub authorized_keys known_hosts
       sshd_config ssh_config sshd.pid sshd.log bin/ssh"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

down() {
  local pid
  if [ -f "$DIR/sshd.pid" ]; then
    pid=$(cat "$DIR/sshd.pid")
    # only the sshd that this DIR's config started (a stale pid file may name some other process by now)
    if grep -qs "$DIR/sshd_config" "/proc/$pid/cmdline"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  fi
  for f in $FILES; do rm -f "$DIR/$f"; done
  rmdir "$DIR/bin" "$DIR" 2>/dev/null || true
}

up() {
  for tool in "$SSHD" ssh ssh-keygen pdsh; do
    command -v "$tool" >/dev/null || {
      echo "local_ssh.sh: $tool not found (apt-get install openssh-server openssh-client pdsh)" >&2; exit 2; }
  done
  down
  mkdir -p "$DIR/bin"
  chmod 700 "$DIR"
  [ "$(id -u)" != 0 ] || mkdir -p -m 755 /run/sshd  # sshd's privilege-separation folder (Debian's service makes it)
  ssh-keygen -q -t ed25519 -N '' -C "diffllm-local-ssh host" -f "$DIR/ssh_host_ed25519_key"
  ssh-keygen -q -t ed25519 -N '' -C "diffllm-local-ssh user" -f "$DIR/id_ed25519"
  cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
  # one name for the host key, whichever alias is used: no prompt, no ~/.ssh/known_hosts entry
  echo "diffllm-local-ssh $(cut -d' ' -f1,2 "$DIR/ssh_host_ed25519_key.pub")" > "$DIR/known_hosts"
  local port user
  port=$(free_port)
  user=$(id -un)
  cat > "$DIR/sshd_config" <<EOF
# Written by tests/launch/local_ssh.sh: key-only logins for $user on 127.0.0.1:$port, state under $DIR
Port $port
ListenAddress 127.0.0.1
HostKey $DIR/ssh_host_ed25519_key
PidFile $DIR/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
AllowUsers $user
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PrintMotd no
X11Forwarding no
AllowAgentForwarding no
# pdsh opens one connection per host at once; DeepSpeed's check and ours come before it
MaxStartups 64
EOF
  cat > "$DIR/ssh_config" <<EOF
# Written by tests/launch/local_ssh.sh: $HOSTS are this machine's sshd on 127.0.0.1:$port
Host $HOSTS
  HostName 127.0.0.1
  Port $port
  User $user
  IdentityFile $DIR/id_ed25519
  IdentitiesOnly yes
  HostKeyAlias diffllm-local-ssh
  UserKnownHostsFile $DIR/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
# every other host: the usual configs (ssh -F skips them otherwise)
Match all
Include ~/.ssh/config
Include /etc/ssh/ssh_config
EOF
  cat > "$DIR/bin/ssh" <<EOF
#!/bin/sh
# tests/launch/local_ssh.sh: ssh with the aliases $HOSTS (config: $DIR/ssh_config)
exec $(command -v ssh) -F $DIR/ssh_config "\$@"
EOF
  chmod 755 "$DIR/bin/ssh"
  "$SSHD" -f "$DIR/sshd_config" -E "$DIR/sshd.log"
  for _ in $(seq 100); do
    if "$DIR/bin/ssh" node-a true 2>/dev/null && "$DIR/bin/ssh" node-b true 2>/dev/null; then
      echo "export PATH=$DIR/bin:\$PATH"
      return 0
    fi
    sleep 0.1
  done
  echo "local_ssh.sh: node-a/node-b did not answer on 127.0.0.1:$port in 10 s; see $DIR/sshd.log" >&2
  "$DIR/bin/ssh" -o LogLevel=INFO node-a true >&2 || true
  tail -n 5 "$DIR/sshd.log" >&2 || true
  down
  exit 1
}

case "$cmd" in
  up) up ;;
  down) down ;;
  *) echo "usage: tests/launch/local_ssh.sh up|down [DIR]" >&2; exit 2 ;;
esac
