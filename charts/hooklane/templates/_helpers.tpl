{{/*
Names, labels and the pieces every Hooklane pod shares (image, security
context, settings), defined once here so that the operator, the workers and
the migration Job cannot drift apart.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "hooklane.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The base of every resource name: fullnameOverride, else the release name,
prefixed with the chart name unless the release name already contains it
(release "hooklane" gives "hooklane-worker", not "hooklane-hooklane-worker").
Truncated to leave room for the longest suffix ("-worker-metrics") in 63.
*/}}
{{- define "hooklane.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 42 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The name of a component's resources: (dict "ctx" $ "component" "worker"). */}}
{{- define "hooklane.componentName" -}}
{{- printf "%s-%s" (include "hooklane.fullname" .ctx) .component }}
{{- end }}

{{/* Labels that select one component's pods; never change them (selectors are immutable). */}}
{{- define "hooklane.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hooklane.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Every object's labels: the selector labels plus version and ownership. */}}
{{- define "hooklane.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "hooklane.selectorLabels" . }}
app.kubernetes.io/version: {{ include "hooklane.imageTag" .ctx | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/part-of: hooklane
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{/*
The peering object that keeps one operator replica active: a
ClusterKopfPeering with --all-namespaces, a KopfPeering of this name in each
watched namespace otherwise. Named after the release so that two releases
never share one.
*/}}
{{- define "hooklane.peeringName" -}}
{{- include "hooklane.fullname" . }}
{{- end }}

{{- define "hooklane.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The container fields all three roles share. The image's entrypoint is
`tini -- hooklane`, so each container's args are just the role.
*/}}
{{- define "hooklane.container" -}}
image: {{ printf "%s:%s" .Values.image.repository (include "hooklane.imageTag" .) | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  # The root filesystem is read-only; Python and libraries that need a
  # scratch file get a writable /tmp.
  - name: tmp
    mountPath: /tmp
{{- end }}

{{/* The pod fields all three roles share; pairs with "hooklane.container". */}}
{{- define "hooklane.pod" -}}
# No Service environment variables: the workers' metrics Service would
# inject HOOKLANE_WORKER_METRICS_*, which Hooklane reads as misspelt settings.
enableServiceLinks: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: 64Mi
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Where a role's pods may run: (dict "role" .Values.worker), plus "affinity"
when the caller computed it (the workers add their anti-affinity). Empty
when nothing is set; callers render it with `with`.
*/}}
{{- define "hooklane.scheduling" -}}
{{- $fields := dict }}
{{- range $key := list "priorityClassName" "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" }}
{{- with index $.role $key }}
{{- $_ := set $fields $key . }}
{{- end }}
{{- end }}
{{- if hasKey . "affinity" }}
{{- $_ := unset $fields "affinity" }}
{{- with .affinity }}
{{- $_ := set $fields "affinity" . }}
{{- end }}
{{- end }}
{{- with $fields }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
The settings every command reads (hooklane/settings.py): the database URL
and the encryption key from Secrets, then `config`, then `extraEnv`. Every
role gets all of them because each command validates the whole settings
object at start, and the migration reseals secrets with the encryption key.
*/}}
{{- define "hooklane.env" -}}
{{- $owned := dict
  "HOOKLANE_DATABASE_URL" "database.existingSecret"
  "HOOKLANE_ENCRYPTION_KEY" "encryptionKey.existingSecret"
  "HOOKLANE_METRICS_PORT" "metrics.port"
  "HOOKLANE_DRAIN_SECONDS" "worker.drainSeconds" }}
{{- $extraNames := list }}
{{- range .Values.extraEnv }}
{{- $extraNames = append $extraNames .name }}
{{- end }}
{{- range $name, $value := $owned }}
{{- if or (hasKey $.Values.config $name) (has $name $extraNames) }}
{{- fail (printf "%s is set by the chart from %s: set that value instead of config or extraEnv" $name $value) }}
{{- end }}
{{- end }}
- name: HOOKLANE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "database.existingSecret is required: the name of a Secret in the release namespace holding the PostgreSQL URL (key database.secretKey, default \"url\"); for CloudNativePG, <cluster>-app with secretKey uri" .Values.database.existingSecret }}
      key: {{ .Values.database.secretKey }}
{{- with .Values.encryptionKey.existingSecret }}
- name: HOOKLANE_ENCRYPTION_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.encryptionKey.secretKey }}
{{- end }}
{{- range $name, $value := .Values.config }}
- name: {{ $name }}
  {{- /* toJson, not toString: a number read from YAML is a float, and
  toString would turn 2592000 into "2.592e+06", which an integer setting
  refuses. */}}
  value: {{ ternary $value (toJson $value) (kindIs "string" $value) | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A probe from its timing values and the HTTP path and port it asks. */}}
{{- define "hooklane.httpProbe" -}}
httpGet:
  path: {{ .path }}
  port: {{ .port }}
{{ toYaml .timing }}
{{- end }}
