"""balancer.race"""
