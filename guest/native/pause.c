/*
 * kata-ts-pause POD_ID HOSTNAME: the pod's namespace holder inside the guest.
 *
 * Creates new UTS and IPC namespaces for itself, sets HOSTNAME in the UTS one, then forks the
 * holder into a new PID namespace (where it is PID 1), prints the holder's pid (in the caller's
 * PID namespace) on stdout and exits. The holder reaps every child re-parented to it (PID 1 of
 * the pod's PID namespace) and ends on SIGTERM or SIGINT. POD_ID only names the process in
 * /proc/<pid>/cmdline, so that the agent can find it again after a restart.
 *
 * Built static (gcc -static -Os) by scripts/build-guest.sh into /usr/lib/kata-ts/kata-ts-pause.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop_requested;

static void on_stop(int sig) {
	(void)sig;
	stop_requested = 1;
}

static void on_child(int sig) { (void)sig; }

static int hold(void) {
	sigset_t blocked, empty;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sa.sa_handler = on_child;
	sigaction(SIGCHLD, &sa, NULL);
	sigemptyset(&blocked);
	sigaddset(&blocked, SIGCHLD);
	sigaddset(&blocked, SIGTERM);
	sigaddset(&blocked, SIGINT);
	sigprocmask(SIG_BLOCK, &blocked, NULL);
	sigemptyset(&empty);
	/* Signals stay blocked except inside sigsuspend: a SIGCHLD cannot slip in between the reap
	 * and the wait, so no zombie is left until the next one. */
	while (!stop_requested) {
		while (waitpid(-1, NULL, WNOHANG) > 0) {
		}
		sigsuspend(&empty);
	}
	return 0;
}

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: kata-ts-pause POD_ID HOSTNAME\n");
		return 2;
	}
	const char *hostname = argv[2];
	if (unshare(CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID) != 0) {
		fprintf(stderr, "kata-ts-pause: unshare: %s\n", strerror(errno));
		return 1;
	}
	if (hostname[0] != '\0' && sethostname(hostname, strlen(hostname)) != 0) {
		fprintf(stderr, "kata-ts-pause: sethostname %s: %s\n", hostname, strerror(errno));
		return 1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "kata-ts-pause: fork: %s\n", strerror(errno));
		return 1;
	}
	if (pid == 0) {
		/* Nothing of the caller's stdio is kept: the agent reads our stdout to its end. */
		int null_fd = open("/dev/null", O_RDWR);
		if (null_fd >= 0) {
			dup2(null_fd, 0);
			dup2(null_fd, 1);
			dup2(null_fd, 2);
			if (null_fd > 2) close(null_fd);
		}
		setsid();
		return hold();
	}
	printf("%d\n", (int)pid);
	return fflush(stdout) == 0 ? 0 : 1;
}
