/*
 * PID 1 of every pod sandbox: holds the pod's namespaces open and does
 * nothing else. Built static so its image needs no libc or shell.
 * It reaps orphans (the containers of a pod share its PID namespace when
 * shareProcessNamespace is set) and exits on SIGTERM/SIGINT so pods stop fast.
 */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { (void)sig; _exit(0); }

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_stop;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sa.sa_handler = on_child;
  sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  sigaction(SIGCHLD, &sa, NULL);
  for (;;) pause();
}
