/* version.h — the k3 release version: the one string `k3 --version` (and anything else that
 * names this build) prints. Bump it with a release note in README.md. */
#ifndef K3_VERSION_H
#define K3_VERSION_H

#define K3_VERSION "0.1.0"

#endif
