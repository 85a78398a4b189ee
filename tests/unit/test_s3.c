/* SPDX-License-Identifier: MIT */
/*
 * test_s3.c - the S3 client (store/s3.c) without a store: the query and key
 * encoding signed as given, the headers every request carries, the
 * ListObjectsV2 reader against good and hostile answers (every truncation
 * and many corruptions of a good one), the AWS credentials/config files and
 * the environment, the HTTP status mapping; then requests to a scripted
 * HTTP server on 127.0.0.1 (a thread of this test): what goes on the wire,
 * retries after 503 and a dropped connection, 403/404/412 as errors that name
 * the key and the status; then the client against the S3 emulator
 * (s3mock.c): buckets, objects, ranges, conditional PUTs, lists in pages,
 * multipart uploads, injected 5xx, dropped connections, a wrong key id and
 * a corrupted object. Against a real radosgw: tests/cluster/ceph_s3.sh.
 */
#include "tap.h"
#include "ulpack.h"
#include "store/s3.h"
#include "s3mock.h"
#include <arpa/inet.h>
#include <errno.h>
#include <openssl/evp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int count_cb(void *arg, const char *key, uint64_t size)
{
	(void)key;
	(void)size;
	(*(int *)arg)++;
	return 0;
}

struct got {
	char keys[8][64];
	uint64_t sizes[8];
	int n;
};
static int keep_cb(void *arg, const char *key, uint64_t size)
{
	struct got *g = arg;
	if (g->n < 8) {
		snprintf(g->keys[g->n], sizeof(g->keys[0]), "%s", key);
		g->sizes[g->n] = size;
	}
	g->n++;
	return 0;
}

static const char good[] =
	"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	"<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>ckpt</Name>"
	"<Prefix>packs/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>"
	"<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>"
	"<Contents><Key>packs/a&amp;b&#x20;&#233;.pack</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified>"
	"<ETag>&quot;0cc175b9c0f1b6a831c399e269772661&quot;</ETag><Size>3100</Size>"
	"<Owner><ID>ci</ID><DisplayName>ci</DisplayName></Owner><StorageClass>STANDARD</StorageClass></Contents>\n"
	"  <Contents><Key>packs/b.pack</Key><Size>0</Size></Contents>"
	"<CommonPrefixes><Prefix>other/</Prefix></CommonPrefixes></ListBucketResult>\n";

static int parse(const char *xml, const char *prefix, int *n, int *trunc, char **next, char *msg, size_t cap)
{
	ulp_err e = {msg, cap};
	*n = 0;
	msg[0] = 0;
	return ulp_s3_parse_list(xml, strlen(xml), prefix, count_cb, n, trunc, next, &e);
}

static void test_list_parser(void)
{
	struct got g = {0};
	int trunc = 0, n;
	char *next = NULL, msg[256];
	ulp_err e = {msg, sizeof(msg)};
	int rc = ulp_s3_parse_list(good, strlen(good), "packs/", keep_cb, &g, &trunc, &next, &e);
	CHECK(rc == 0, "good page: %d %s", rc, msg);
	CHECK(g.n == 2, "2 keys, got %d", g.n);
	CHECK(strcmp(g.keys[0], "packs/a&b \xc3\xa9.pack") == 0, "entities decoded: '%s'", g.keys[0]);
	CHECK(g.sizes[0] == 3100 && g.sizes[1] == 0, "sizes %llu %llu", (unsigned long long)g.sizes[0],
	      (unsigned long long)g.sizes[1]);
	CHECK(trunc == 1 && next && strcmp(next, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=") == 0, "token '%s'",
	      next ? next : "(null)");
	free(next);

	const char *last = "<ListBucketResult><IsTruncated>false</IsTruncated><KeyCount>0</KeyCount></ListBucketResult>";
	CHECK(parse(last, "p/", &n, &trunc, &next, msg, sizeof(msg)) == 0 && n == 0 && !trunc && !next,
	      "an empty last page: %s", msg);
	free(next);

	/* hostile or broken answers: an error, and no key given out */
	static const char *const bad[] = {
		"",
		"<ListBucketResult>",
		"<Error><Code>AccessDenied</Code></Error>",
		"<!DOCTYPE x [<!ENTITY a \"aaaa\">]><ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>",
		"<ListBucketResult><!-- c --><IsTruncated>false</IsTruncated></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult><ListBucketResult/>",
		"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>junk",
		"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucket>",
		"<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>",
		"<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
		"<ListBucketResult><KeyCount>1</KeyCount></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>other/x</Key><Size>1</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/x</Key></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Size>1</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/x</Key><Size>-1</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/x</Key><Size>18446744073709551616</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/x</Key><Key>p/y</Key><Size>1</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/&bogus;</Key><Size>1</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/&#0;</Key><Size>1</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/&#xD800;</Key><Size>1</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/\x01</Key><Size>1</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents>text<Key>p/x</Key><Size>1</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key a=>p/x</Key><Size>1</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/x</Key><Size>1</Size></Contents>"
		"<NextContinuationToken>a</NextContinuationToken><NextContinuationToken>b</NextContinuationToken></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><![CDATA[x]]></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><?pi x?></ListBucketResult>",
		"<ListBucketResult><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a></a></a></a></a></a></a></a></a></a>"
		"</a></a></a></a></a></a></a></a><IsTruncated>false</IsTruncated></ListBucketResult>",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		rc = parse(bad[i], "p/", &n, &trunc, &next, msg, sizeof(msg));
		CHECK(rc == -ULP_E_CORRUPT && n == 0 && !next, "hostile answer %zu taken: rc %d, %d keys", i, rc, n);
		CHECK(strstr(msg, "ListObjectsV2"), "hostile answer %zu: message '%s'", i, msg);
	}
	/* a key over 1024 bytes */
	char *big = malloc(3000);
	REQUIRE(big, "malloc");
	int k = snprintf(big, 3000, "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/");
	memset(big + k, 'x', 1100);
	snprintf(big + k + 1100, 3000 - (size_t)k - 1100, "</Key><Size>1</Size></Contents></ListBucketResult>");
	CHECK(parse(big, "p/", &n, &trunc, &next, msg, sizeof(msg)) == -ULP_E_CORRUPT && n == 0, "a 1100-byte key");
	free(big);

	/* every proper prefix of the good page fails (no half page is taken);
	 * a cut inside trailing blanks is whole */
	size_t len = strlen(good), end = len;
	while (end > 0 && (good[end - 1] == '\n' || good[end - 1] == ' '))
		end--;
	int taken = 0;
	for (size_t cut = 0; cut < end; cut++) {
		struct got h = {0};
		rc = ulp_s3_parse_list(good, cut, "packs/", keep_cb, &h, &trunc, &next, &e);
		if (rc == 0 || h.n) {
			taken++;
			free(next);
		}
	}
	CHECK(taken == 0, "%d truncations of a good page were taken", taken);
	/* random byte changes: never a crash (ASan), a key outside the prefix never given */
	char *m = malloc(len + 1);
	REQUIRE(m, "malloc");
	for (int it = 0; it < 20000; it++) {
		memcpy(m, good, len + 1);
		for (int j = 0; j < 1 + (int)(tap_rand() % 3); j++)
			m[tap_rand() % len] = (char)(tap_rand() % 256);
		struct got h = {0};
		rc = ulp_s3_parse_list(m, len, "packs/", keep_cb, &h, &trunc, &next, &e);
		for (int j = 0; j < h.n && j < 8; j++)
			CHECK(strncmp(h.keys[j], "packs/", 6) == 0, "a key outside the prefix: '%s'", h.keys[j]);
		if (rc == 0)
			free(next);
	}
	free(m);

	char code[64];
	const char *err = "<?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code><Message>m</Message></Error>";
	CHECK(ulp_s3_xml_child(err, strlen(err), "Code", code, sizeof(code)) == 1 &&
	          strcmp(code, "SignatureDoesNotMatch") == 0, "error code '%s'", code);
	CHECK(ulp_s3_xml_child("<Error>", 7, "Code", code, sizeof(code)) < 0, "a cut error body is malformed");
}

static void test_encode(void)
{
	char *s = ulp_s3_uri_encode("packs/", 6, 0);
	CHECK(s && strcmp(s, "packs%2F") == 0, "query value packs/ -> '%s'", s ? s : "(null)");
	free(s);
	s = ulp_s3_uri_encode("a b/c~d-e_f.g+h=\xc3\xa9", 18, 1);
	CHECK(s && strcmp(s, "a%20b/c~d-e_f.g%2Bh%3D%C3%A9") == 0, "key -> '%s'", s ? s : "(null)");
	free(s);
	s = ulp_s3_uri_encode("", 0, 0);
	CHECK(s && !*s, "empty");
	free(s);
}

static void test_status(void)
{
	CHECK(ulp_s3_status_err(200) == 0 && ulp_s3_status_err(204) == 0 && ulp_s3_status_err(206) == 0, "2xx");
	CHECK(ulp_s3_status_err(404) == -ULP_E_NOENT, "404");
	CHECK(ulp_s3_status_err(412) == -ULP_E_EXIST, "412");
	CHECK(ulp_s3_status_err(403) == -ULP_E_INVAL && ulp_s3_status_err(400) == -ULP_E_INVAL, "403, 400");
	CHECK(ulp_s3_status_err(409) == -ULP_E_BUSY, "409");
	CHECK(ulp_s3_status_err(416) == -ULP_E_CORRUPT, "416");
	CHECK(ulp_s3_status_err(500) == 1 && ulp_s3_status_err(503) == 1 && ulp_s3_status_err(429) == 1, "retried");
}

static char tmpd[] = "/tmp/test_s3.XXXXXX";

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	REQUIRE(f && fputs(text, f) >= 0 && fclose(f) == 0, "write %s", path);
}

static void clear_env(void)
{
	static const char *const v[] = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
	                                "AWS_SECURITY_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
	                                "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_CA_BUNDLE"};
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		unsetenv(v[i]);
}

static void test_conf(void)
{
	char cred[300], cfg[300], msg[512];
	ulp_err e = {msg, sizeof(msg)};
	ulp_s3_conf c;
	const char *credtext = "# comment\n[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key=SKDEFAULT\n"
	                       "\n[ci]\r\n  ; indented comment\naws_access_key_id=AKCI\r\naws_secret_access_key = SK=CI \r\n"
	                       "aws_session_token = TOKCI\n[empty]\n";
	const char *cfgtext = "[default]\nregion = eu-west-1\n[profile ci]\nregion=us-west-2\n"
	                      "endpoint_url = http://10.0.0.1:7480\ns3 =\n  endpoint_url = http://nested:1\n"
	                      "ca_bundle = /etc/ci-ca.pem\n[profile keys]\naws_access_key_id = AKCFG\n"
	                      "aws_secret_access_key = SKCFG\n";
	char *v = NULL;
	CHECK(ulp_s3_ini_get(credtext, strlen(credtext), "ci", "aws_secret_access_key", &v) == 1 && v &&
	          strcmp(v, "SK=CI") == 0, "value with '=' and CRLF: '%s'", v ? v : "(null)");
	free(v);
	CHECK(ulp_s3_ini_get(credtext, strlen(credtext), "empty", "aws_access_key_id", &v) == 0 && !v, "absent");
	CHECK(ulp_s3_ini_get(cfgtext, strlen(cfgtext), "profile ci", "endpoint_url", &v) == 1 && v &&
	          strcmp(v, "http://10.0.0.1:7480") == 0, "nested s3 block ignored: '%s'", v ? v : "(null)");
	free(v);

	REQUIRE(mkdtemp(tmpd), "mkdtemp");
	snprintf(cred, sizeof(cred), "%s/credentials", tmpd);
	snprintf(cfg, sizeof(cfg), "%s/config", tmpd);
	write_text(cred, credtext);
	write_text(cfg, cfgtext);
	clear_env();
	setenv("AWS_SHARED_CREDENTIALS_FILE", cred, 1);
	setenv("AWS_CONFIG_FILE", cfg, 1);

	int rc = ulp_s3_conf_load(&c, NULL, &e);
	CHECK(rc == 0 && !strcmp(c.access_key, "AKDEFAULT") && !strcmp(c.secret_key, "SKDEFAULT") && !c.session_token &&
	          !strcmp(c.region, "eu-west-1") && !strcmp(c.endpoint, "https://s3.eu-west-1.amazonaws.com") &&
	          !c.ca_bundle, "default profile: %d %s", rc, msg);
	ulp_s3_conf_free(&c);

	setenv("AWS_PROFILE", "ci", 1);
	rc = ulp_s3_conf_load(&c, NULL, &e);
	CHECK(rc == 0 && !strcmp(c.access_key, "AKCI") && !strcmp(c.secret_key, "SK=CI") && c.session_token &&
	          !strcmp(c.session_token, "TOKCI") && !strcmp(c.region, "us-west-2") &&
	          !strcmp(c.endpoint, "http://10.0.0.1:7480") && c.ca_bundle && !strcmp(c.ca_bundle, "/etc/ci-ca.pem"),
	      "AWS_PROFILE=ci: %d %s", rc, msg);
	ulp_s3_conf_free(&c);

	rc = ulp_s3_conf_load(&c, "keys", &e);
	CHECK(rc == 0 && !strcmp(c.access_key, "AKCFG") && !strcmp(c.region, "us-east-1"),
	      "keys in the config file, region default: %d %s", rc, msg);
	ulp_s3_conf_free(&c);

	setenv("AWS_ACCESS_KEY_ID", "AKENV", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "SKENV", 1);
	setenv("AWS_SESSION_TOKEN", "TOKENV", 1);
	setenv("AWS_REGION", "ap-south-1", 1);
	setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
	setenv("AWS_CA_BUNDLE", "/tmp/ca.pem", 1);
	rc = ulp_s3_conf_load(&c, NULL, &e);
	CHECK(rc == 0 && !strcmp(c.access_key, "AKENV") && !strcmp(c.secret_key, "SKENV") &&
	          !strcmp(c.session_token, "TOKENV") && !strcmp(c.region, "ap-south-1") &&
	          !strcmp(c.endpoint, "http://127.0.0.1:9000/") && !strcmp(c.ca_bundle, "/tmp/ca.pem"),
	      "the environment first: %d %s", rc, msg);
	ulp_s3_conf_free(&c);

	clear_env();
	rc = ulp_s3_conf_load(&c, "empty", &e);
	CHECK(rc == -ULP_E_INVAL && strstr(msg, "no S3 credentials") && strstr(msg, "'empty'"), "no keys: %d %s", rc, msg);
	rc = ulp_s3_conf_load(&c, "a]b", &e);
	CHECK(rc == -ULP_E_INVAL, "a bad profile name");
	unsetenv("AWS_SHARED_CREDENTIALS_FILE");
	unsetenv("AWS_CONFIG_FILE");
	unlink(cred);
	unlink(cfg);
	rmdir(tmpd);
}

static ulp_s3 *client(const char *endpoint, const char *token, ulp_err *e)
{
	ulp_s3_conf c = {0};
	ulp_s3 *s = NULL;
	c.endpoint = (char *)endpoint;
	c.region = (char *)"us-east-1";
	c.access_key = (char *)"AKTEST";
	c.secret_key = (char *)"SECRETSECRET";
	c.session_token = (char *)token;
	c.max_tries = 3;
	c.backoff_ms = 10;
	int rc = ulp_s3_open(&c, "ckpt", &s, e);
	return rc == 0 ? s : NULL;
}

static void test_headers(void)
{
	char msg[256], out[1024];
	ulp_err e = {msg, sizeof(msg)};
	ulp_s3 *s = client("http://127.0.0.1:1", "TOKVALUE", &e);
	REQUIRE(s, "open: %s", msg);
	CHECK(ulp_s3_debug_headers(s, "UNSIGNED-PAYLOAD", NULL, 1, out, sizeof(out)) == 0, "headers");
	CHECK(strstr(out, "x-amz-content-sha256: UNSIGNED-PAYLOAD\n") && strstr(out, "If-None-Match: *\n") &&
	          strstr(out, "x-amz-security-token: (set)\n") && !strstr(out, "TOKVALUE") && !strstr(out, "If-Match:"),
	      "create-if-absent headers:\n%s", out);
	CHECK(ulp_s3_debug_headers(s, "abc", "1234", 0, out, sizeof(out)) == 0 && strstr(out, "If-Match: 1234\n") &&
	          !strstr(out, "If-None-Match"), "compare-and-swap headers:\n%s", out);
	ulp_s3_close(s);
	s = client("http://127.0.0.1:1", NULL, &e);
	REQUIRE(s, "open");
	CHECK(ulp_s3_debug_headers(s, "abc", NULL, 0, out, sizeof(out)) == 0 && !strstr(out, "security-token"),
	      "no token, no header:\n%s", out);
	ulp_s3_close(s);
	ulp_s3_conf c = {.endpoint = (char *)"ftp://x", .region = (char *)"us-east-1", .access_key = (char *)"a",
	                 .secret_key = (char *)"b"};
	CHECK(ulp_s3_open(&c, "ckpt", &s, &e) == -ULP_E_INVAL && !s, "ftp endpoint refused");
	c.endpoint = (char *)"http://x";
	CHECK(ulp_s3_open(&c, "Bad_Bucket", &s, &e) == -ULP_E_INVAL && !s, "bad bucket name refused");
}

/* ---- a scripted HTTP server ---------------------------------------------- */
struct srv {
	int lfd, port;
	const char *const *answers; /* one per connection, NULL-terminated; "DROP": close at once */
	char log[16][2048];         /* each request's head */
	int n;
	pthread_t th;
};

static void *srv_main(void *arg)
{
	struct srv *v = arg;
	for (int i = 0; v->answers[i]; i++) {
		int fd = accept(v->lfd, NULL, NULL);
		if (fd < 0)
			break;
		char buf[8192];
		size_t got = 0;
		char *end = NULL;
		while (got < sizeof(buf) - 1) {
			ssize_t r = read(fd, buf + got, sizeof(buf) - 1 - got);
			if (r <= 0)
				break;
			got += (size_t)r;
			buf[got] = 0;
			if ((end = strstr(buf, "\r\n\r\n")))
				break;
		}
		if (end) {
			size_t hl = (size_t)(end - buf) + 4;
			const char *cl = strcasestr(buf, "\r\ncontent-length:");
			size_t body = cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0;
			if (strcasestr(buf, "\r\nexpect: 100-continue"))
				(void)!write(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25);
			size_t have = got - hl;
			while (have < body) {
				ssize_t r = read(fd, buf + hl, sizeof(buf) - hl - 1 < body - have ? sizeof(buf) - hl - 1 : body - have);
				if (r <= 0)
					break;
				have += (size_t)r;
			}
			if (v->n < 16) {
				size_t k = hl < sizeof(v->log[0]) - 1 ? hl : sizeof(v->log[0]) - 1;
				memcpy(v->log[v->n], buf, k);
				v->log[v->n][k] = 0;
				v->n++;
			}
		}
		if (strcmp(v->answers[i], "DROP") != 0)
			(void)!write(fd, v->answers[i], strlen(v->answers[i]));
		close(fd);
	}
	return NULL;
}

static int srv_start(struct srv *v, const char *const *answers)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	memset(v, 0, sizeof(*v));
	v->answers = answers;
	v->lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (v->lfd < 0 || bind(v->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(v->lfd, 8) != 0 ||
	    getsockname(v->lfd, (struct sockaddr *)&a, &al) != 0)
		return -1;
	v->port = ntohs(a.sin_port);
	return pthread_create(&v->th, NULL, srv_main, v) == 0 ? 0 : -1;
}

static void srv_stop(struct srv *v)
{
	shutdown(v->lfd, SHUT_RDWR);
	pthread_join(v->th, NULL);
	close(v->lfd);
}

static void *head_twice(void *arg)
{
	intptr_t n = 0;
	for (int i = 0; i < 2; i++) {
		uint64_t size = 0;
		char etag[ULP_S3_ETAG_MAX];
		n += ulp_s3_head(arg, "k", &size, etag, NULL) == 0 && size == 7 && strcmp(etag, "\"abc\"") == 0;
	}
	return (void *)n;
}

#define OK_HDR "HTTP/1.1 200 OK\r\nConnection: close\r\n"

static void test_wire(void)
{
	char msg[512], ep[64];
	ulp_err e = {msg, sizeof(msg)};
	struct srv v;

	/* a list of two pages; a 503 and a dropped connection retried */
	static const char *const list_ans[] = {
		"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
		OK_HDR "Content-Length: 172\r\n\r\n<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>t/1+"
		"</NextContinuationToken><Contents><Key>packs/1</Key><Size>5</Size></Contents></ListBucketResult>",
		"DROP",
		OK_HDR "Content-Length: 122\r\n\r\n<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>packs/2</Key>"
		"<Size>6</Size></Contents></ListBucketResult>",
		NULL};
	REQUIRE(srv_start(&v, list_ans) == 0, "server");
	snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", v.port);
	ulp_s3 *s = client(ep, NULL, &e);
	REQUIRE(s, "open: %s", msg);
	struct got g = {0};
	int rc = ulp_s3_list(s, "packs/", 2, keep_cb, &g, &e);
	CHECK(rc == 0 && g.n == 2 && !strcmp(g.keys[0], "packs/1") && !strcmp(g.keys[1], "packs/2") && g.sizes[1] == 6,
	      "list through a 503 and a dropped connection: %d %s (%d keys)", rc, msg, g.n);
	srv_stop(&v);
	CHECK(v.n == 4, "4 requests, %d", v.n);
	CHECK(strncmp(v.log[0], "GET /ckpt?list-type=2&max-keys=2&prefix=packs%2F HTTP/1.1\r\n", 58) == 0,
	      "first page's request line: %.80s", v.log[0]);
	CHECK(strncmp(v.log[3], "GET /ckpt?continuation-token=t%2F1%2B&list-type=2&max-keys=2&prefix=packs%2F ", 77) == 0,
	      "second page's request line: %.100s", v.log[3]);
	for (int i = 0; i < v.n && i < 16; i++) {
		CHECK(strcasestr(v.log[i], "\r\nx-amz-content-sha256: "
		                           "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\r\n"),
		      "request %d without the content hash:\n%s", i, v.log[i]);
		CHECK(strstr(v.log[i], "Authorization: AWS4-HMAC-SHA256 Credential=AKTEST/") &&
		          strstr(v.log[i], "/us-east-1/s3/aws4_request") && strcasestr(v.log[i], "x-amz-content-sha256;"),
		      "request %d not signed with the hash header:\n%s", i, v.log[i]);
		CHECK(!strstr(v.log[i], "SECRETSECRET"), "the secret went on the wire");
	}

	/* errors: 403 with a code, 404, 412; bounded retries of 500 */
	static const char *const err_ans[] = {
		"HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 59\r\n\r\n"
		"<Error><Code>SignatureDoesNotMatch</Code><Message/></Error>",
		"HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 412 Precondition Failed\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 500 Internal\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 500 Internal\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 500 Internal\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
		NULL};
	REQUIRE(srv_start(&v, err_ans) == 0, "server");
	ulp_s3_close(s);
	snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", v.port);
	s = client(ep, "TOKVALUE", &e);
	REQUIRE(s, "open");
	char buf[16];
	rc = ulp_s3_get_range(s, "packs/a b", 10, buf, sizeof(buf), &e);
	CHECK(rc == -ULP_E_INVAL && strstr(msg, "s3://ckpt/packs/a b") && strstr(msg, "HTTP 403") &&
	          strstr(msg, "SignatureDoesNotMatch") && strstr(msg, "credentials") && !strstr(msg, "SECRET") &&
	          !strstr(msg, "TOKVALUE"), "403: %d %s", rc, msg);
	rc = ulp_s3_head(s, "packs/x", NULL, NULL, &e);
	CHECK(rc == -ULP_E_NOENT && strstr(msg, "s3://ckpt/packs/x") && strstr(msg, "HTTP 404"), "404: %d %s", rc, msg);
	rc = ulp_s3_put_cond(s, "CURRENT", "abc", 3, NULL, NULL, &e);
	CHECK(rc == -ULP_E_EXIST && strstr(msg, "HTTP 412") && strstr(msg, "condition"), "412: %d %s", rc, msg);
	rc = ulp_s3_delete(s, "packs/y", &e);
	CHECK(rc == -ULP_E_IO && strstr(msg, "HTTP 500") && strstr(msg, "after 3 tries"), "500 x3: %d %s", rc, msg);
	srv_stop(&v);
	CHECK(v.n == 6, "6 requests, %d", v.n);
	CHECK(strncmp(v.log[0], "GET /ckpt/packs/a%20b HTTP/1.1", 30) == 0 && strstr(v.log[0], "\r\nRange: bytes=10-25\r\n"),
	      "range GET:\n%s", v.log[0]);
	CHECK(strstr(v.log[0], "\r\nx-amz-security-token: TOKVALUE\r\n"), "the session token sent:\n%s", v.log[0]);
	CHECK(strncmp(v.log[2], "PUT /ckpt/CURRENT HTTP/1.1", 26) == 0 && strstr(v.log[2], "\r\nIf-None-Match: *\r\n") &&
	          strstr(v.log[2], "\r\nx-amz-content-sha256: "
	                           "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\r\n"),
	      "conditional PUT with the body's SHA-256:\n%s", v.log[2]);
	CHECK(strncmp(v.log[3], "DELETE /ckpt/packs/y ", 21) == 0, "DELETE:\n%s", v.log[3]);

	/* a range GET: the right bytes, or an error on a wrong range or length */
	static const char *const get_ans[] = {
		"HTTP/1.1 206 Partial\r\nConnection: close\r\nContent-Range: bytes 10-13/100\r\nContent-Length: 4\r\n\r\nwxyz",
		"HTTP/1.1 206 Partial\r\nConnection: close\r\nContent-Range: bytes 0-3/100\r\nContent-Length: 4\r\n\r\nabcd",
		"HTTP/1.1 206 Partial\r\nConnection: close\r\nContent-Range: bytes 10-12/13\r\nContent-Length: 3\r\n\r\nwxy",
		"HTTP/1.1 206 Partial\r\nConnection: close\r\nContent-Range: bytes 10-13/100\r\nContent-Length: 4\r\n\r\nwx",
		"HTTP/1.1 206 Partial\r\nConnection: close\r\nContent-Range: bytes 10-13/100\r\nContent-Length: 4\r\n\r\nwxyz",
		NULL};
	REQUIRE(srv_start(&v, get_ans) == 0, "server");
	ulp_s3_close(s);
	snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", v.port);
	s = client(ep, NULL, &e);
	REQUIRE(s, "open");
	memset(buf, 0, sizeof(buf));
	rc = ulp_s3_get_range(s, "k", 10, buf, 4, &e);
	CHECK(rc == 0 && memcmp(buf, "wxyz", 4) == 0, "range GET: %d %s", rc, msg);
	rc = ulp_s3_get_range(s, "k", 10, buf, 4, &e);
	CHECK(rc == -ULP_E_CORRUPT && strstr(msg, "another range") && memcmp(buf, "\0\0\0\0", 4) == 0,
	      "another range: %d %s", rc, msg);
	rc = ulp_s3_get_range(s, "k", 10, buf, 4, &e);
	CHECK(rc == -ULP_E_CORRUPT, "a short object: %d %s", rc, msg);
	/* a body cut short: retried, then the right bytes */
	rc = ulp_s3_get_range(s, "k", 10, buf, 4, &e);
	CHECK(rc == 0 && memcmp(buf, "wxyz", 4) == 0, "a cut body retried: %d %s", rc, msg);
	srv_stop(&v);
	ulp_s3_close(s);

	/* one client, four threads at once (its handle pool; TSan in CI) */
#define HEAD_ANS "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 7\r\nETag: \"abc\"\r\n\r\n"
	static const char *const head_ans[] = {HEAD_ANS, HEAD_ANS, HEAD_ANS, HEAD_ANS, HEAD_ANS, HEAD_ANS,
	                                       HEAD_ANS, HEAD_ANS, NULL};
	REQUIRE(srv_start(&v, head_ans) == 0, "server");
	snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", v.port);
	s = client(ep, NULL, &e);
	REQUIRE(s, "open");
	pthread_t th[4];
	int good_heads = 0;
	for (int i = 0; i < 4; i++)
		REQUIRE(pthread_create(&th[i], NULL, head_twice, s) == 0, "pthread_create");
	for (int i = 0; i < 4; i++) {
		void *r;
		pthread_join(th[i], &r);
		good_heads += (int)(intptr_t)r;
	}
	CHECK(good_heads == 8, "%d of 8 HEADs from 4 threads", good_heads);
	srv_stop(&v);
	ulp_s3_close(s);
}

/* ---- the client against the S3 emulator (s3mock.c) ------------------------ */
static ulp_s3 *mock_client(s3mock *m, const char *bucket, const char *key_id, ulp_err *e)
{
	ulp_s3_conf c = {0};
	ulp_s3 *s = NULL;
	c.endpoint = (char *)s3mock_endpoint(m);
	c.region = (char *)"us-east-1";
	c.access_key = (char *)key_id;
	c.secret_key = (char *)"SECRETSECRET";
	c.max_tries = 3;
	c.backoff_ms = 5;
	c.multipart_threshold = 6u << 20; /* a 12 MB object goes in 5 MiB parts */
	c.part_size = 5u << 20;
	return ulp_s3_open(&c, bucket, &s, e) == 0 ? s : NULL;
}

/* the quoted hex MD5 of p (a single PUT's ETag) */
static void md5_etag(const void *p, size_t n, char out[ULP_S3_ETAG_MAX])
{
	unsigned char d[16];
	unsigned dn = sizeof(d);
	EVP_Digest(p, n, d, &dn, EVP_md5(), NULL);
	out[0] = '"';
	for (int i = 0; i < 16; i++)
		snprintf(out + 1 + 2 * i, 3, "%02x", d[i]);
	strcpy(out + 33, "\"");
}

/* S3's ETag of a multipart object of n bytes at p in parts of psz */
static void multipart_etag(const unsigned char *p, size_t n, size_t psz, char out[ULP_S3_ETAG_MAX])
{
	EVP_MD_CTX *x = EVP_MD_CTX_new();
	unsigned char d[16];
	unsigned dn = sizeof(d);
	size_t parts = 0;
	EVP_DigestInit_ex(x, EVP_md5(), NULL);
	for (size_t off = 0; off < n; off += psz, parts++) {
		EVP_Digest(p + off, n - off < psz ? n - off : psz, d, &dn, EVP_md5(), NULL);
		EVP_DigestUpdate(x, d, 16);
	}
	EVP_DigestFinal_ex(x, d, &dn);
	EVP_MD_CTX_free(x);
	out[0] = '"';
	for (int i = 0; i < 16; i++)
		snprintf(out + 1 + 2 * i, 3, "%02x", d[i]);
	snprintf(out + 33, ULP_S3_ETAG_MAX - 33, "-%zu\"", parts);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

struct mock_worker {
	ulp_s3 *s;
	int id, ok;
};

static void *mock_work(void *arg)
{
	struct mock_worker *w = arg;
	unsigned char put[4096], got[4096];
	char key[64];
	for (int i = 0; i < 16; i++) {
		snprintf(key, sizeof(key), "thr/%d/%02d", w->id, i);
		for (size_t j = 0; j < sizeof(put); j++)
			put[j] = (unsigned char)(j * 7 + (size_t)w->id * 31 + (size_t)i);
		if (ulp_s3_put(w->s, key, put, sizeof(put), NULL) != 0 ||
		    ulp_s3_get_range(w->s, key, 0, got, sizeof(got), NULL) != 0 || memcmp(put, got, sizeof(put)) != 0)
			continue;
		w->ok++;
	}
	return NULL;
}

static void test_mock(void)
{
	char msg[512], etag[ULP_S3_ETAG_MAX], want[ULP_S3_ETAG_MAX], e1[ULP_S3_ETAG_MAX], e2[ULP_S3_ETAG_MAX];
	char buf[256];
	ulp_err e = {msg, sizeof(msg)};
	s3mock *m = NULL;
	uint64_t size = 0;
	size_t n = 0;
	int rc;
	REQUIRE(s3mock_start(&m) == 0, "s3mock_start");
	CHECK(strncmp(s3mock_endpoint(m), "http://127.0.0.1:", 17) == 0, "endpoint %s", s3mock_endpoint(m));
	ulp_s3 *s = mock_client(m, "ckpt", "testkey", &e);
	REQUIRE(s, "open: %s", msg);

	/* the bucket: missing, then created (twice: 409 BucketAlreadyOwnedByYou is ours) */
	rc = ulp_s3_put(s, "a", "x", 1, &e);
	CHECK(rc == -ULP_E_NOENT && strstr(msg, "NoSuchBucket"), "PUT before the bucket: %d %s", rc, msg);
	rc = ulp_s3_bucket_create(s, &e);
	CHECK(rc == 0, "bucket create: %d %s", rc, msg);
	rc = ulp_s3_bucket_create(s, &e);
	CHECK(rc == 0, "bucket create again: %d %s", rc, msg);

	/* put, get, range, head, delete; a key with ' ', '+' and '/' */
	static const char text[] = "hello, object store";
	const size_t tl = sizeof(text) - 1;
	const char *k = "dir/a b+c";
	rc = ulp_s3_put(s, k, text, tl, &e);
	CHECK(rc == 0, "PUT: %d %s", rc, msg);
	memset(buf, 0, sizeof(buf));
	rc = ulp_s3_get_range(s, k, 0, buf, tl, &e);
	CHECK(rc == 0 && memcmp(buf, text, tl) == 0, "GET: %d %s '%s'", rc, msg, buf);
	memset(buf, 0, sizeof(buf));
	rc = ulp_s3_get_range(s, k, 7, buf, 6, &e);
	CHECK(rc == 0 && strcmp(buf, "object") == 0, "range GET: %d %s '%s'", rc, msg, buf);
	md5_etag(text, tl, want);
	rc = ulp_s3_head(s, k, &size, etag, &e);
	CHECK(rc == 0 && size == tl && strcmp(etag, want) == 0, "HEAD: %d %s size %llu etag %s (want %s)", rc, msg,
	      (unsigned long long)size, etag, want);
	char *direct = s3mock_get_object(m, "ckpt/dir/a b+c", &n);
	CHECK(direct && n == tl && memcmp(direct, text, tl) == 0, "the mock holds the bytes under the decoded key");
	free(direct);
	rc = ulp_s3_get_range(s, k, tl, buf, 1, &e);
	CHECK(rc == -ULP_E_CORRUPT && strstr(msg, "HTTP 416") && strstr(msg, "InvalidRange"), "past the end: %d %s", rc,
	      msg);
	rc = ulp_s3_get_range(s, "dir/none", 0, buf, 1, &e);
	CHECK(rc == -ULP_E_NOENT && strstr(msg, "s3://ckpt/dir/none") && strstr(msg, "NoSuchKey"), "no key: %d %s", rc,
	      msg);
	rc = ulp_s3_delete(s, k, &e);
	CHECK(rc == 0, "DELETE: %d %s", rc, msg);
	rc = ulp_s3_head(s, k, NULL, NULL, &e);
	CHECK(rc == -ULP_E_NOENT && strstr(msg, "HTTP 404"), "HEAD after DELETE: %d %s", rc, msg);
	CHECK(ulp_s3_delete(s, k, &e) == 0, "DELETE of a missing key: %s", msg);
	CHECK(!s3mock_get_object(m, "ckpt/dir/a b+c", &n), "gone from the mock");
	CHECK(s3mock_put_object(m, "ckpt/direct", "abc", 3) == 0, "s3mock_put_object");
	memset(buf, 0, sizeof(buf));
	rc = ulp_s3_get_range(s, "direct", 0, buf, 3, &e);
	CHECK(rc == 0 && strcmp(buf, "abc") == 0, "an object put by the test: %d %s", rc, msg);
	CHECK(s3mock_delete_object(m, "ckpt/direct") == 0 && s3mock_delete_object(m, "ckpt/direct") == -1,
	      "s3mock_delete_object");

	/* conditional PUTs: create-if-absent, compare-and-swap */
	rc = ulp_s3_put_cond(s, "CURRENT", "v1", 2, NULL, e1, &e);
	CHECK(rc == 0 && e1[0] == '"', "If-None-Match on a new key: %d %s %s", rc, msg, e1);
	rc = ulp_s3_put_cond(s, "CURRENT", "v2", 2, NULL, NULL, &e);
	CHECK(rc == -ULP_E_EXIST && strstr(msg, "HTTP 412") && strstr(msg, "PreconditionFailed"),
	      "If-None-Match on an existing key: %d %s", rc, msg);
	rc = ulp_s3_put_cond(s, "CURRENT", "v2", 2, e1, e2, &e);
	CHECK(rc == 0 && strcmp(e1, e2) != 0, "If-Match the current ETag: %d %s", rc, msg);
	unsigned long nput = s3mock_count(m, "PUT");
	rc = ulp_s3_put_cond(s, "CURRENT", "v3", 2, e1, NULL, &e);
	CHECK(rc == -ULP_E_EXIST && strstr(msg, "HTTP 412"), "If-Match a stale ETag: %d %s", rc, msg);
	CHECK(s3mock_count(m, "PUT") - nput == 2, "a stale ETag is tried bare and quoted: %lu PUTs",
	      s3mock_count(m, "PUT") - nput);
	memset(buf, 0, sizeof(buf));
	CHECK(ulp_s3_get_range(s, "CURRENT", 0, buf, 2, &e) == 0 && strcmp(buf, "v2") == 0, "CURRENT is v2: '%s'", buf);
	char bare[ULP_S3_ETAG_MAX];
	snprintf(bare, sizeof(bare), "%.*s", (int)strlen(e2) - 2, e2 + 1);
	rc = ulp_s3_put_cond(s, "CURRENT", "v3", 2, bare, NULL, &e);
	CHECK(rc == 0, "If-Match the bare ETag: %d %s", rc, msg);
	rc = ulp_s3_put_cond(s, "NOTYET", "v1", 2, e2, NULL, &e);
	CHECK(rc == -ULP_E_EXIST, "If-Match on a missing key: %d %s", rc, msg);

	/* a list of three pages of two, in key order */
	static const char *const lk[] = {"l/3", "k/x", "l/1", "l/0", "m/x", "l/4", "l/2"};
	for (size_t i = 0; i < sizeof(lk) / sizeof(lk[0]); i++)
		CHECK(ulp_s3_put(s, lk[i], lk[i], strlen(lk[i]) - 1, &e) == 0, "PUT %s: %s", lk[i], msg);
	unsigned long lists = s3mock_count(m, "LIST");
	struct got g = {0};
	rc = ulp_s3_list(s, "l/", 2, keep_cb, &g, &e);
	CHECK(rc == 0 && g.n == 5, "list l/ by 2: %d %s, %d keys", rc, msg, g.n);
	for (int i = 0; i < 5 && i < g.n; i++) {
		char kk[8];
		snprintf(kk, sizeof(kk), "l/%d", i);
		CHECK(strcmp(g.keys[i], kk) == 0 && g.sizes[i] == 2, "key %d: %s size %llu", i, g.keys[i],
		      (unsigned long long)g.sizes[i]);
	}
	CHECK(s3mock_count(m, "LIST") - lists == 3, "3 pages, %lu", s3mock_count(m, "LIST") - lists);
	int cnt = 0;
	CHECK(ulp_s3_list(s, "none/", 0, count_cb, &cnt, &e) == 0 && cnt == 0, "an empty list: %s", msg);
	cnt = 0;
	CHECK(ulp_s3_list(s, "", 0, count_cb, &cnt, &e) == 0 && cnt == 8, "the whole bucket: %d keys", cnt);

	/* multipart: 12 MB in parts of 5 MiB, from memory and from a file */
	const size_t big = 12000000;
	unsigned char *p = malloc(big), *q = malloc(big);
	REQUIRE(p && q, "malloc");
	for (size_t i = 0; i < big; i++)
		p[i] = (unsigned char)(tap_rand() >> 56);
	unsigned long posts = s3mock_count(m, "POST");
	nput = s3mock_count(m, "PUT");
	rc = ulp_s3_put(s, "big", p, big, &e);
	CHECK(rc == 0, "multipart PUT: %d %s", rc, msg);
	CHECK(s3mock_count(m, "POST") - posts == 2 && s3mock_count(m, "PUT") - nput == 3,
	      "start + 3 parts + complete: %lu POST, %lu PUT", s3mock_count(m, "POST") - posts,
	      s3mock_count(m, "PUT") - nput);
	multipart_etag(p, big, 5u << 20, want);
	rc = ulp_s3_head(s, "big", &size, etag, &e);
	CHECK(rc == 0 && size == big && strcmp(etag, want) == 0, "multipart HEAD: %d size %llu etag %s (want %s)", rc,
	      (unsigned long long)size, etag, want);
	memset(q, 0, big);
	rc = ulp_s3_get_range(s, "big", 0, q, big, &e);
	CHECK(rc == 0 && memcmp(p, q, big) == 0, "multipart GET: %d %s", rc, msg);
	CHECK(s3mock_uploads(m) == 0, "no upload left: %d", s3mock_uploads(m));

	char path[] = "/tmp/test_s3_mock.XXXXXX";
	int fd = mkstemp(path);
	REQUIRE(fd >= 0 && write(fd, p, big) == (ssize_t)big, "temp file");
	unlink(path);
	rc = ulp_s3_put_file(s, "bigfile", fd, big, &e);
	direct = s3mock_get_object(m, "ckpt/bigfile", &n);
	CHECK(rc == 0 && direct && n == big && memcmp(direct, p, big) == 0, "multipart PUT from a file: %d %s", rc,
	      msg);
	free(direct);
	rc = ulp_s3_put_file(s, "smallfile", fd, 2u << 20, &e);
	direct = s3mock_get_object(m, "ckpt/smallfile", &n);
	CHECK(rc == 0 && direct && n == 2u << 20 && memcmp(direct, p, n) == 0, "single PUT from a file: %d %s", rc,
	      msg);
	free(direct);
	close(fd);

	/* faults: a 503 then success; 500 every time; a dropped connection */
	nput = s3mock_count(m, "PUT");
	s3mock_fail_next(m, 1, 503);
	rc = ulp_s3_put(s, "r", "retry", 5, &e);
	CHECK(rc == 0 && s3mock_count(m, "PUT") - nput == 2, "a 503 retried: %d %s, %lu PUTs", rc, msg,
	      s3mock_count(m, "PUT") - nput);
	s3mock_fail_next(m, 3, 500);
	rc = ulp_s3_get_range(s, "r", 0, buf, 5, &e);
	CHECK(rc == -ULP_E_IO && strstr(msg, "HTTP 500") && strstr(msg, "InternalError") && strstr(msg, "after 3 tries"),
	      "500 three times: %d %s", rc, msg);
	s3mock_fail_next(m, 3, 500); /* a HEAD's answer has no body, so no error code */
	rc = ulp_s3_head(s, "r", NULL, NULL, &e);
	CHECK(rc == -ULP_E_IO && strstr(msg, "HTTP 500") && strstr(msg, "after 3 tries"), "HEAD: 500 three times: %d %s",
	      rc, msg);
	unsigned long gets = s3mock_count(m, "GET");
	s3mock_drop_next(m, 1);
	memset(buf, 0, sizeof(buf));
	rc = ulp_s3_get_range(s, "r", 0, buf, 5, &e);
	CHECK(rc == 0 && strcmp(buf, "retry") == 0 && s3mock_count(m, "GET") - gets == 2,
	      "a dropped GET retried: %d %s, %lu GETs", rc, msg, s3mock_count(m, "GET") - gets);
	s3mock_drop_next(m, 1); /* a body the mock never read */
	rc = ulp_s3_put(s, "dropped", p, 2u << 20, &e);
	direct = s3mock_get_object(m, "ckpt/dropped", &n);
	CHECK(rc == 0 && direct && n == 2u << 20 && memcmp(direct, p, n) == 0, "a dropped 2 MB PUT retried: %d %s", rc,
	      msg);
	free(direct);

	/* a key id the store does not know */
	ulp_s3 *bad = mock_client(m, "ckpt", "otherkey", &e);
	REQUIRE(bad, "open");
	rc = ulp_s3_get_range(bad, "r", 0, buf, 5, &e);
	CHECK(rc == -ULP_E_INVAL && strstr(msg, "s3://ckpt/r") && strstr(msg, "403") && strstr(msg, "InvalidAccessKeyId") &&
	          !strstr(msg, "SECRETSECRET"), "a wrong key id: %d %s", rc, msg);
	rc = ulp_s3_head(bad, "r", NULL, NULL, &e);
	CHECK(rc == -ULP_E_INVAL && strstr(msg, "s3://ckpt/r") && strstr(msg, "HTTP 403") && strstr(msg, "credentials"),
	      "a wrong key id, HEAD: %d %s", rc, msg);
	s3mock_set_key(m, "otherkey");
	CHECK(ulp_s3_head(bad, "r", NULL, NULL, &e) == 0, "the key id the mock now wants: %s", msg);
	CHECK(ulp_s3_head(s, "r", NULL, NULL, &e) == -ULP_E_INVAL, "and the old one refused");
	s3mock_set_key(m, "testkey");
	ulp_s3_close(bad);

	/* a corrupted object: the bytes come as stored, the ETag unchanged */
	unsigned char c0[100], c1[100];
	for (int i = 0; i < 100; i++)
		c0[i] = (unsigned char)i;
	CHECK(ulp_s3_put(s, "c", c0, sizeof(c0), &e) == 0, "PUT c: %s", msg);
	CHECK(ulp_s3_head(s, "c", NULL, e1, &e) == 0, "HEAD c: %s", msg);
	CHECK(s3mock_corrupt(m, "ckpt/c", 5) == 0, "s3mock_corrupt");
	CHECK(s3mock_corrupt(m, "ckpt/c", 100) == -1 && s3mock_corrupt(m, "ckpt/none", 0) == -1,
	      "s3mock_corrupt past the end or of no object");
	rc = ulp_s3_get_range(s, "c", 0, c1, sizeof(c1), &e);
	CHECK(rc == 0 && c1[5] == (c0[5] ^ 0xff) && memcmp(c1, c0, 5) == 0 && memcmp(c1 + 6, c0 + 6, 94) == 0,
	      "the corrupt bytes come back: %d %s (byte 5: %u)", rc, msg, c1[5]);
	CHECK(ulp_s3_head(s, "c", NULL, e2, &e) == 0 && strcmp(e1, e2) == 0, "the ETag unchanged: %s %s", e1, e2);

	/* a stall delays every answer */
	s3mock_stall_ms(m, 60);
	double t0 = now_ms();
	CHECK(ulp_s3_head(s, "c", NULL, NULL, &e) == 0, "HEAD with a stall: %s", msg);
	double dt = now_ms() - t0;
	CHECK(dt >= 55, "a stall of 60 ms took %.1f ms", dt);
	s3mock_stall_ms(m, 0);

	/* four threads on one client (the mock's lock; TSan) */
	struct mock_worker w[4];
	pthread_t th[4];
	for (int i = 0; i < 4; i++) {
		w[i] = (struct mock_worker){.s = s, .id = i};
		REQUIRE(pthread_create(&th[i], NULL, mock_work, &w[i]) == 0, "pthread_create");
	}
	int ok = 0;
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		ok += w[i].ok;
	}
	CHECK(ok == 64, "%d of 64 PUT+GET from 4 threads", ok);
	CHECK(s3mock_count(m, "ALL") > 100 && s3mock_count(m, "nonsense") == 0, "counts: %lu",
	      s3mock_count(m, "ALL"));
	free(p);
	free(q);

	/* the mock stops under a client that holds its connections */
	s3mock_stop(m);
	rc = ulp_s3_head(s, "c", NULL, NULL, &e);
	CHECK(rc == -ULP_E_IO, "after s3mock_stop: %d %s", rc, msg);
	ulp_s3_close(s);
	s3mock_stop(NULL);
}

/* ---- issue 34 item 6: a hung store ------------------------------------------ */

/* The environment's time limits: a request to a store that accepts and
 * never answers gives up within its deadline, tries and pauses included. */
static void test_deadline(void)
{
	char msg[512], buf[64];
	ulp_err e = {msg, sizeof(msg)};
	s3mock *m = NULL;
	ulp_s3_conf c;
	REQUIRE(s3mock_start(&m) == 0, "s3mock_start");
	clear_env();
	setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent", 1);
	setenv("AWS_CONFIG_FILE", "/nonexistent", 1);
	setenv("AWS_ACCESS_KEY_ID", "testkey", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "SECRETSECRET", 1);
	setenv("AWS_ENDPOINT_URL", s3mock_endpoint(m), 1);
	setenv("ULPACK_S3_TIMEOUT", "nonsense", 1);
	int rc = ulp_s3_conf_load(&c, NULL, &e);
	CHECK(rc == -ULP_E_INVAL && strstr(msg, "ULPACK_S3_TIMEOUT"), "a bad ULPACK_S3_TIMEOUT is refused: %d %s", rc,
	      rc ? msg : "");
	if (rc == 0)
		ulp_s3_conf_free(&c);
	setenv("ULPACK_S3_TIMEOUT", "2", 1);
	setenv("ULPACK_S3_STALL_TIMEOUT", "1", 1);
	rc = ulp_s3_conf_load(&c, NULL, &e);
	REQUIRE(rc == 0, "conf: %d %s", rc, msg);
	ulp_s3 *s = NULL;
	rc = ulp_s3_open(&c, "ckpt", &s, &e);
	ulp_s3_conf_free(&c);
	REQUIRE(rc == 0, "open: %d %s", rc, msg);
	REQUIRE(ulp_s3_bucket_create(s, &e) == 0 && ulp_s3_put(s, "k", "hello", 5, &e) == 0, "put: %s", msg);
	s3mock_hang(m, 1);
	double t0 = now_ms();
	size_t n = 0;
	rc = ulp_s3_get(s, "k", buf, sizeof(buf), &n, NULL, &e);
	double took = now_ms() - t0;
	CHECK(rc == -ULP_E_IO && strstr(msg, "s3://ckpt/k"), "a hung store: the GET fails: %d %s", rc, msg);
	CHECK(took >= 900 && took < 3500, "within its deadline (2 s): %.0f ms", took);
	s3mock_hang(m, 0);
	rc = ulp_s3_get(s, "k", buf, sizeof(buf), &n, NULL, &e);
	CHECK(rc == 0 && n == 5 && !memcmp(buf, "hello", 5), "and works again once it answers: %d %s", rc, rc ? msg : "");
	ulp_s3_close(s);
	unsetenv("ULPACK_S3_TIMEOUT");
	unsetenv("ULPACK_S3_STALL_TIMEOUT");
	clear_env();
	unsetenv("AWS_SHARED_CREDENTIALS_FILE");
	unsetenv("AWS_CONFIG_FILE");
	s3mock_stop(m);
}

static int flag_set(void *arg)
{
	return __atomic_load_n((int *)arg, __ATOMIC_RELAXED);
}

struct raiser {
	int *flag;
	unsigned after_ms;
};

static void *raise_later(void *arg)
{
	struct raiser *r = arg;
	usleep(r->after_ms * 1000);
	__atomic_store_n(r->flag, 1, __ATOMIC_RELAXED);
	return NULL;
}

/* The thread's interrupt check ends a request on a hung store early, and a
 * pause between tries too. */
static void test_interrupt(void)
{
	char msg[512], buf[64];
	ulp_err e = {msg, sizeof(msg)};
	s3mock *m = NULL;
	REQUIRE(s3mock_start(&m) == 0, "s3mock_start");
	ulp_s3 *s = mock_client(m, "ckpt", "testkey", &e);
	REQUIRE(s, "client: %s", msg);
	REQUIRE(ulp_s3_bucket_create(s, &e) == 0 && ulp_s3_put(s, "k", "hello", 5, &e) == 0, "put: %s", msg);
	int flag = 0;
	pthread_t th;
	struct raiser ra = {&flag, 300};
	ulp_set_interrupt(flag_set, &flag);
	s3mock_hang(m, 1);
	REQUIRE(pthread_create(&th, NULL, raise_later, &ra) == 0, "thread");
	double t0 = now_ms();
	size_t n = 0;
	int rc = ulp_s3_get(s, "k", buf, sizeof(buf), &n, NULL, &e);
	double took = now_ms() - t0;
	pthread_join(th, NULL);
	CHECK(rc == -ULP_E_INTR && strstr(msg, "interrupted") && strstr(msg, "s3://ckpt/k"),
	      "the check ends a hung GET: %d %s", rc, msg);
	CHECK(took >= 250 && took < 1800, "soon after it is raised (300 ms): %.0f ms", took);
	CHECK(ulp_to_errno(rc) == EINTR, "as EINTR");
	s3mock_hang(m, 0);
	/* raised already: the next request does not start */
	rc = ulp_s3_head(s, "k", NULL, NULL, &e);
	CHECK(rc == -ULP_E_INTR, "a request after it is raised stops at once: %d %s", rc, msg);
	/* the pauses between tries: 503s with a long backoff */
	ulp_set_interrupt(NULL, NULL);
	rc = ulp_s3_head(s, "k", NULL, NULL, &e);
	CHECK(rc == 0, "no check: the request works: %d %s", rc, rc ? msg : "");
	ulp_s3_close(s);
	ulp_s3_conf c = {0};
	c.endpoint = (char *)s3mock_endpoint(m);
	c.region = (char *)"us-east-1";
	c.access_key = (char *)"testkey";
	c.secret_key = (char *)"SECRETSECRET";
	c.max_tries = 5;
	c.backoff_ms = 4000;
	REQUIRE(ulp_s3_open(&c, "ckpt", &s, &e) == 0, "client: %s", msg);
	flag = 0;
	ulp_set_interrupt(flag_set, &flag);
	s3mock_fail_next(m, 5, 503);
	REQUIRE(pthread_create(&th, NULL, raise_later, &ra) == 0, "thread");
	t0 = now_ms();
	rc = ulp_s3_head(s, "k", NULL, NULL, &e);
	took = now_ms() - t0;
	pthread_join(th, NULL);
	CHECK(rc == -ULP_E_INTR && took < 1500, "a pause between tries is cut short: %d in %.0f ms: %s", rc, took, msg);
	ulp_set_interrupt(NULL, NULL);
	s3mock_fail_next(m, 0, 503);
	ulp_s3_close(s);
	s3mock_stop(m);
}

int main(void)
{
	test_encode();
	test_status();
	test_list_parser();
	test_conf();
	test_headers();
	test_wire();
	test_mock();
	test_deadline();
	test_interrupt();
	return tap_done();
}
