{{/*
Names, labels and the pieces every Hooklane pod shares (image, security
context, settings), defined once here so that the operator, the workers,
the API and the migration Job cannot drift apart.
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

{{/* Where tenants' self-service endpoints go: portal.namespace, else the release's. */}}
{{- define "hooklane.portalNamespace" -}}
{{- .Values.portal.namespace | default .Release.Namespace }}
{{- end }}

{{- define "hooklane.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The container fields every role shares: (dict "ctx" $), plus "volumeMounts"
for a role's own mounts (the API's tokens). The image's entrypoint is
`tini -- hooklane`, so each container's args are just the role.
*/}}
{{- define "hooklane.container" -}}
{{- $values := .ctx.Values -}}
image: {{ printf "%s:%s" $values.image.repository (include "hooklane.imageTag" .ctx) | quote }}
imagePullPolicy: {{ $values.image.pullPolicy }}
securityContext:
  {{- toYaml $values.securityContext | nindent 2 }}
volumeMounts:
  # The root filesystem is read-only; Python and libraries that need a
  # scratch file get a writable /tmp.
  - name: tmp
    mountPath: /tmp
  {{- with .volumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/*
The pod fields every role shares: (dict "ctx" $), plus "volumes" for a
role's own; pairs with "hooklane.container".
*/}}
{{- define "hooklane.pod" -}}
{{- $values := .ctx.Values -}}
# No Service environment variables: the Services of release "hooklane"
# would inject HOOKLANE_WORKER_METRICS_*, read as misspelt settings, and
# HOOKLANE_API_PORT=tcp://..., which would replace the API's port setting.
enableServiceLinks: false
securityContext:
  {{- toYaml $values.podSecurityContext | nindent 2 }}
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: 64Mi
  {{- with .volumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $values.imagePullSecrets }}
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
and the encryption key from Secrets, then the settings map, then
`extraEnv`. Called as (dict "ctx" $), which takes `config`, or with
"config" set to the map a role uses instead (the API's is `api.config` over
`config`). Every role gets all of them because each command validates the
whole settings object at start, and the migration reseals secrets with the
encryption key.
*/}}
{{- define "hooklane.env" -}}
{{- $values := .ctx.Values }}
{{- $config := hasKey . "config" | ternary .config $values.config }}
{{- $owned := dict
  "HOOKLANE_DATABASE_URL" "database.existingSecret"
  "HOOKLANE_ENCRYPTION_KEY" "encryptionKey.existingSecret"
  "HOOKLANE_METRICS_PORT" "metrics.port"
  "HOOKLANE_DRAIN_SECONDS" "worker.drainSeconds"
  "HOOKLANE_TENANT_MAX_IN_FLIGHT" "worker.tenantMaxInFlight"
  "HOOKLANE_API_PORT" "api.port"
  "HOOKLANE_API_DRAIN_SECONDS" "api.drainSeconds"
  "HOOKLANE_API_HEADER_TIMEOUT_SECONDS" "api.headerTimeoutSeconds"
  "HOOKLANE_API_MAX_CONNECTIONS" "api.maxConnections"
  "HOOKLANE_API_TOKENS" "api.tokens.ingest"
  "HOOKLANE_API_TOKENS_FILE" "api.tokens.ingest"
  "HOOKLANE_ADMIN_TOKENS" "api.tokens.admin"
  "HOOKLANE_ADMIN_TOKENS_FILE" "api.tokens.admin"
  "HOOKLANE_PORTAL_ENDPOINTS" "portal.endpoints"
  "HOOKLANE_PORTAL_NAMESPACE" "portal.namespace"
  "HOOKLANE_PORTAL_MAX_ENDPOINTS" "portal.maxEndpoints"
  "HOOKLANE_PORTAL_MAX_CONCURRENCY" "portal.maxConcurrency"
  "HOOKLANE_PORTAL_MAX_TIMEOUT_SECONDS" "portal.maxTimeoutSeconds"
  "HOOKLANE_PORTAL_EVENT_TYPES" "portal.eventTypes"
  "HOOKLANE_PORTAL_URL_HOSTS" "portal.urlHosts"
  "HOOKLANE_PORTAL_HTTPS_ONLY" "portal.httpsOnly" }}
{{- $extraNames := list }}
{{- range $values.extraEnv }}
{{- $extraNames = append $extraNames .name }}
{{- end }}
{{- range $name, $value := $owned }}
{{- if or (hasKey $config $name) (has $name $extraNames) }}
{{- fail (printf "%s is set by the chart from %s: set that value instead of config or extraEnv" $name $value) }}
{{- end }}
{{- end -}}
- name: HOOKLANE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "database.existingSecret is required: the name of a Secret in the release namespace holding the PostgreSQL URL (key database.secretKey, default \"url\"); for CloudNativePG, <cluster>-app with secretKey uri" $values.database.existingSecret }}
      key: {{ $values.database.secretKey }}
{{- with $values.encryptionKey.existingSecret }}
- name: HOOKLANE_ENCRYPTION_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $values.encryptionKey.secretKey }}
{{- end }}
{{- range $name, $value := $config }}
- name: {{ $name }}
  {{- /* toJson, not toString: a number read from YAML is a float, and
  toString would turn 2592000 into "2.592e+06", which an integer setting
  refuses. */}}
  value: {{ ternary $value (toJson $value) (kindIs "string" $value) | quote }}
{{- end }}
{{- with $values.extraEnv }}
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

{{/*
Where the API's token files come from, one Secret key per audience that has
tokens: YAML of {ingest: {name, key}, admin: {name, key}}. The chart's own
Secret (api-tokens.yaml) holds the entries given in values; an
existingSecret holds them under tokens.secretKey. Refuses an API without
ingest tokens, which `hooklane api` would refuse at start anyway (in a crash
loop), and an audience given both ways, where one would be silently ignored.
*/}}
{{- define "hooklane.apiTokenSources" -}}
{{- $tokens := .Values.api.tokens }}
{{- $chartSecret := include "hooklane.componentName" (dict "ctx" . "component" "api-tokens") }}
{{- $sources := dict }}
{{- range $audience := list "ingest" "admin" }}
{{- $entries := index $tokens $audience }}
{{- $existing := index $tokens.existingSecret $audience }}
{{- if and $entries $existing }}
{{- fail (printf "api.tokens.%s and api.tokens.existingSecret.%s are both set: give the %s tokens one way" $audience $audience $audience) }}
{{- else if $entries }}
{{- $_ := set $sources $audience (dict "name" $chartSecret "key" $audience) }}
{{- else if $existing }}
{{- $_ := set $sources $audience (dict "name" $existing "key" $tokens.secretKey) }}
{{- end }}
{{- end }}
{{- if not (hasKey $sources "ingest") }}
{{- fail "api.tokens.ingest or api.tokens.existingSecret.ingest is required while api.enabled: `hooklane api` accepts no event without a token (or set api.enabled=false)" }}
{{- end }}
{{- toYaml $sources }}
{{- end }}
