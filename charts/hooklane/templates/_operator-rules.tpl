{{/*
The operator's RBAC: the API calls `hooklane operator` makes and nothing
more, each rule saying why. operator-rbac.yaml grants them cluster-wide
(--all-namespaces), or the namespaced ones in each watched namespace.
tests/kube/test_operator.py::test_the_chart_rbac_is_enough runs the operator with
exactly these rules against a real API server.
*/}}

{{/* Rules on objects inside the watched namespaces. */}}
{{- define "hooklane.operator.namespacedRules" -}}
# The resources it syncs: list and watch them; patch to add and remove its
# finalizer and to keep kopf's handling state in annotations. No get,
# create, update or delete: users own WebhookEndpoints.
- apiGroups: [hooklane.io]
  resources: [webhookendpoints]
  verbs: [list, watch, patch]
# Queue health, phase and conditions written back onto each endpoint.
- apiGroups: [hooklane.io]
  resources: [webhookendpoints/status]
  verbs: [patch]
# Signing secrets and spec.delivery's headers and TLS material, read from a
# watch so that a rotation reaches the workers at once. Read-only; only
# values shaped like a whsec_ secret, a PEM block or a header value are kept
# in memory.
- apiGroups: [""]
  resources: [secrets]
  verbs: [list, watch]
# Events on WebhookEndpoints: paused, resumed, deactivated, dead deliveries,
# missing or malformed Secret, handler failures.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.operator.watchNamespaces }}
# Peering (--peering) per watched namespace: each replica writes its
# keep-alive into the KopfPeering's status and watches the others', so that
# one is active.
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [list, watch, patch]
{{- end }}
{{- end }}

{{/* Rules on cluster-scoped objects, needed in both modes. */}}
{{- define "hooklane.operator.clusterRules" -}}
# The event catalogue's types (cluster-scoped, so watched in both modes):
# list and watch them; patch for its finalizer and kopf's annotations. No
# get, create, update or delete: the platform owns WebhookEventTypes.
- apiGroups: [hooklane.io]
  resources: [webhookeventtypes]
  verbs: [list, watch, patch]
# Ready, the stored type and its latest version, written back onto each.
- apiGroups: [hooklane.io]
  resources: [webhookeventtypes/status]
  verbs: [patch]
# kopf notices the WebhookEndpoint, WebhookEventType and peering CRDs being
# installed or upgraded without a restart.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.operator.watchNamespaces }}
# With --namespace, kopf checks which of the named namespaces exist and
# starts watching one as soon as it is created.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- else }}
# Peering (--peering) across the cluster: each replica writes its keep-alive
# into the ClusterKopfPeering's status and watches the others', so that one
# is active.
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [list, watch, patch]
{{- end }}
{{- end }}
