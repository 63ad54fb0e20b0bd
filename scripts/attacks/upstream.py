import os
import http.server, sys, threading, json, time
counts = {}
lock = threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def handle_any(self):
        n = int(self.headers.get('content-length') or 0)
        if n: self.rfile.read(n)
        if self.path == '/__counts':
            body = json.dumps(counts).encode()
        elif self.path == '/__reset':
            with lock: counts.clear()
            body = b'{}'
        else:
            with lock:
                counts[self.command + ' ' + self.path] = counts.get(self.command + ' ' + self.path, 0) + 1
                counts['_total'] = counts.get('_total', 0) + 1
            if self.path.startswith('/slow'): time.sleep(10)
            body = b'x' * (1 << 20) if self.path.startswith('/big') else b'ok\n'
        self.send_response(200); self.send_header('content-length', str(len(body))); self.end_headers()
        if self.command != 'HEAD': self.wfile.write(body)
    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = handle_any
http.server.ThreadingHTTPServer.request_queue_size = 4096
http.server.ThreadingHTTPServer.daemon_threads = True
http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
