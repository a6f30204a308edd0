/* A stand-in for the nginx and httpd e2e test images critest uses, built on busybox's httpd.
 *
 * What critest looks at: the process is found as NAME (`pidof nginx`: the kernel's comm is the basename of
 * the executable), its /proc/PID/cmdline reads like the real master process, it writes its pid to PID_FILE,
 * answers HTTP on the port in PORT_FILE (default 80) from DOC_ROOT, and says NAME in its log. It stops on
 * SIGTERM/SIGINT/SIGQUIT even as pid 1 and reaps every child. The names are chosen with -D at build time. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef NAME
#define NAME "nginx"
#endif
#ifndef PROC_TITLE
#define PROC_TITLE "nginx: master process nginx -g daemon off;"
#endif
#ifndef EXE
#define EXE "/usr/sbin/nginx"
#endif
#ifndef PID_FILE
#define PID_FILE "/var/run/nginx.pid"
#endif
#ifndef DOC_ROOT
#define DOC_ROOT "/usr/share/nginx/html"
#endif
#ifndef PORT_FILE
#define PORT_FILE "/etc/nginx/port"
#endif
#ifndef HTTPD
#define HTTPD "/bin/busybox"
#endif

static volatile pid_t server = -1;

static void stop(int sig)
{
    (void)sig;
    if (server > 0)
        kill(server, SIGTERM);
    _exit(0);
}

static void read_port(char *port, size_t len)
{
    FILE *f = fopen(PORT_FILE, "r");
    snprintf(port, len, "80");
    if (f != NULL) {
        if (fscanf(f, "%15s", port) != 1)
            snprintf(port, len, "80");
        fclose(f);
    }
}

int main(int argc, char **argv)
{
    char port[16];
    FILE *f;

    /* Run again with argv[0] set to the title, so that cmdline shows it (comm stays the file name). */
    if (argc < 1 || strcmp(argv[0], PROC_TITLE) != 0) {
        char *args[] = {(char *)PROC_TITLE, NULL};
        execv(EXE, args);
        perror("exec " EXE);
        return 1;
    }
    read_port(port, sizeof(port));
    f = fopen(PID_FILE, "w");
    if (f != NULL) {
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
    }
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    signal(SIGQUIT, stop);
    server = fork();
    if (server < 0) {
        perror("fork");
        return 1;
    }
    if (server == 0) {
        execl(HTTPD, "httpd", "-f", "-p", port, "-h", DOC_ROOT, (char *)NULL);
        perror("exec " HTTPD);
        _exit(127);
    }
    fprintf(stderr, "%s: husk test stand-in (busybox httpd), pid %d, port %s\n", NAME, (int)getpid(), port);
    fflush(stderr);
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid == server)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        if (pid < 0 && errno != EINTR)
            return 1;
    }
}
